//! The credential runtime: exec'ing KEP-5339 / client-go exec plugins, caching their
//! credentials per spoke, and building spoke clients that use them.
