//! The cipher-suite order kleym's clients offer: AES-128-GCM before AES-256-GCM.
//!
//! rustls (with ring) offers `TLS13_AES_256_GCM_SHA384` first, and both rustls and Go's
//! `crypto/tls` (kube-apiserver) pick the client's first suite they support. client-go
//! offers `TLS13_AES_128_GCM_SHA256` first, as Go does on CPUs with AES instructions, so a
//! kube-apiserver normally talks AES-128 to its clients. kleym now does the same: AES-128
//! takes ten rounds per block against AES-256's fourteen, and its key schedule hashes with
//! SHA-256 rather than SHA-384 (which ring computes without the CPU's SHA instructions).
//! `TLS_AES_128_GCM_SHA256` is the one suite every TLS 1.3 implementation must support
//! (RFC 8446, section 9.1). No suite is added or removed, only the order changes (tested
//! below).
//!
//! kube builds the rustls configuration of every client (`Config::rustls_client_config`)
//! from the process's default provider, so the order is set there, once, by
//! [`install_client_crypto_provider`] at the start of `main`.

use rustls::crypto::CryptoProvider;
use rustls::{CipherSuite, SupportedCipherSuite};

/// ring's provider with the AES-256-GCM suites moved after the others of their TLS
/// version (TLS 1.3: AES-128-GCM, ChaCha20-Poly1305, AES-256-GCM, Go's own order).
pub fn client_crypto_provider() -> CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    // A stable sort: TLS 1.3 before TLS 1.2 as before, and within each version the
    // AES-256 suites last, the rest in ring's order.
    provider
        .cipher_suites
        .sort_by_key(|suite| (is_tls12(suite), is_aes_256(suite.suite())));
    provider
}

/// Installs [`client_crypto_provider`] as the process's default provider. `false` when a
/// default was already installed (it is then kept: rustls allows one per process).
pub fn install_client_crypto_provider() -> bool {
    client_crypto_provider().install_default().is_ok()
}

fn is_tls12(suite: &SupportedCipherSuite) -> bool {
    matches!(suite, SupportedCipherSuite::Tls12(_))
}

fn is_aes_256(suite: CipherSuite) -> bool {
    matches!(
        suite,
        CipherSuite::TLS13_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suites(provider: &CryptoProvider) -> Vec<CipherSuite> {
        provider.cipher_suites.iter().map(|s| s.suite()).collect()
    }

    #[test]
    fn aes_128_comes_first_and_no_suite_is_added_or_dropped() {
        let ours = suites(&client_crypto_provider());
        let ring = suites(&rustls::crypto::ring::default_provider());
        assert_eq!(
            &ours[..3],
            [
                CipherSuite::TLS13_AES_128_GCM_SHA256,
                CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
                CipherSuite::TLS13_AES_256_GCM_SHA384,
            ]
        );
        let (mut a, mut b) = (ours.clone(), ring.clone());
        a.sort_by_key(|s| u16::from(*s));
        b.sort_by_key(|s| u16::from(*s));
        assert_eq!(a, b, "same suites, reordered: {ours:?} against {ring:?}");
        // Every TLS 1.3 suite still comes before every TLS 1.2 suite.
        let first_tls12 = client_crypto_provider()
            .cipher_suites
            .iter()
            .position(is_tls12)
            .unwrap_or(ours.len());
        assert!(
            client_crypto_provider().cipher_suites[first_tls12..]
                .iter()
                .all(is_tls12),
            "{ours:?}"
        );
        // The key exchange groups are ring's, unchanged.
        let groups = |p: &CryptoProvider| p.kx_groups.iter().map(|g| g.name()).collect::<Vec<_>>();
        assert_eq!(
            groups(&client_crypto_provider()),
            groups(&rustls::crypto::ring::default_provider())
        );
    }

    /// A handshake, in memory, between a client with [`client_crypto_provider`] and a
    /// server with ring's defaults (which, like kube-apiserver, takes the client's order).
    fn negotiated(client: CryptoProvider) -> Option<CipherSuite> {
        use std::sync::Arc;
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).ok()?;
        let cert = ck.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(ck.signing_key.serialize_der()).ok()?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.clone()).ok()?;
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(client))
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .ok()?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .ok()?;
        let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).ok()?;
        let mut s = rustls::ServerConnection::new(Arc::new(server)).ok()?;
        for _ in 0..10 {
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).ok()?;
            }
            s.read_tls(&mut buf.as_slice()).ok()?;
            s.process_new_packets().ok()?;
            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).ok()?;
            }
            c.read_tls(&mut buf.as_slice()).ok()?;
            c.process_new_packets().ok()?;
        }
        let suite = s.negotiated_cipher_suite()?.suite();
        (c.negotiated_cipher_suite()?.suite() == suite).then_some(suite)
    }

    #[test]
    fn a_server_that_takes_the_clients_order_talks_aes_128() {
        assert_eq!(
            negotiated(client_crypto_provider()),
            Some(CipherSuite::TLS13_AES_128_GCM_SHA256)
        );
        // The check can fail: ring's own order gives AES-256.
        assert_eq!(
            negotiated(rustls::crypto::ring::default_provider()),
            Some(CipherSuite::TLS13_AES_256_GCM_SHA384)
        );
    }

    #[test]
    fn kube_builds_its_tls_configuration_from_the_process_default() {
        // Whichever provider this test process installed first (rustls allows one), kube's
        // configuration uses it: so the one `main` installs is the one every client offers.
        let _ = install_client_crypto_provider();
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap_or_default());
        let tls = kube::client::ConfigExt::rustls_client_config(&config);
        let default = CryptoProvider::get_default();
        match (tls, default) {
            (Ok(tls), Some(default)) => {
                assert!(std::sync::Arc::ptr_eq(tls.crypto_provider(), default));
            }
            (tls, default) => panic!("no configuration or no default: {tls:?} {default:?}"),
        }
    }
}
