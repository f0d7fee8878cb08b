//! Per-cluster PKI: CA, serving certificate for 127.0.0.1/localhost, client certificates.
