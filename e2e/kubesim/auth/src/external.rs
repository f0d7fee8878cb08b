//! External JWT issuers.
