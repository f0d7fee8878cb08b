//! ServiceAccount token issuer (RS256 JWTs, OIDC discovery, JWKS, rotation) and verification
//! of tokens from external issuers.
