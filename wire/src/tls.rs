//! TLS between commscope's parts (`--tls-cert FILE --tls-key FILE [--tls-ca FILE]`,
//! docs/security.md), with rustls.
//!
//! On the collector, the certificate and key serve its gRPC and HTTP listeners (their URLs are
//! then `https://`); with a CA, gRPC clients must present a certificate that CA signed (mutual
//! TLS). On a client (agent, TUI, simulator), the CA is the one that signed the collector's
//! certificate (else the system's roots), and a certificate and key are its own identity for
//! mutual TLS.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A certificate chain and its key, parsed.
type Parsed = (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

/// A certificate chain and its key, as PEM bytes.
type Pem = (Vec<u8>, Vec<u8>);

/// The PEM files of one side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

impl TlsFiles {
    /// Nothing given: plaintext.
    pub fn is_empty(&self) -> bool {
        self.cert.is_none() && self.key.is_none() && self.ca.is_none()
    }

    /// The certificate and key (PEM), which go together.
    fn identity(&self) -> Result<Option<Pem>, String> {
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Ok(Some((read("certificate", c)?, read("key", k)?))),
            (None, None) => Ok(None),
            _ => Err("--tls-cert and --tls-key go together".into()),
        }
    }

    /// A listener's TLS: None when no certificate is given (plaintext). `alpn`: the protocols
    /// it speaks (`h2` for gRPC, `http/1.1` for HTTP). With a CA and `verify_clients`, clients
    /// must present a certificate that CA signed (mutual TLS). A CA without a certificate is an
    /// error: a listener has nothing to present.
    pub fn server(
        &self,
        alpn: &[&[u8]],
        verify_clients: bool,
    ) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
        let Some((cert, key)) = self.identity()? else {
            return match self.ca {
                Some(_) => Err("--tls-ca on a listener needs --tls-cert and --tls-key".into()),
                None => Ok(None),
            };
        };
        let (certs, key) = check_pem(&cert, &key)?;
        let provider = Arc::new(provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match (&self.ca, verify_clients) {
            (Some(ca), true) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certificates(&read("CA certificate", ca)?, "CA certificate")? {
                    roots
                        .add(c)
                        .map_err(|e| format!("the CA certificate {}: {e}", ca.display()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| format!("the CA certificate {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut c = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("the TLS certificate and key: {e}"))?;
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Some(Arc::new(c)))
    }

    /// A client's endpoint for `url`: with this TLS when the URL is `https://`, as it is
    /// otherwise.
    pub fn endpoint(
        &self,
        endpoint: tonic::transport::Endpoint,
        url: &str,
    ) -> Result<tonic::transport::Endpoint, String> {
        if !url.starts_with("https://") {
            return Ok(endpoint);
        }
        endpoint
            .tls_config(self.client()?)
            .map_err(|e| format!("TLS to {url}: {e}"))
    }

    /// A gRPC client's TLS.
    pub fn client(&self) -> Result<ClientTlsConfig, String> {
        let mut c = ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = &self.ca {
            c = c.ca_certificate(Certificate::from_pem(read("CA certificate", ca)?));
        }
        if let Some((cert, key)) = self.identity()? {
            check_pem(&cert, &key)?;
            c = c.identity(Identity::from_pem(cert, key));
        }
        Ok(c)
    }
}

/// rustls' ring provider: what tonic and reqwest here are built with (aws-lc-rs, which rustls
/// now prefers for its post-quantum key exchange, needs a C and CMake build).
#[allow(deprecated)]
fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn certificates(
    pem: &[u8],
    what: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the {what} is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("the {what} file holds no certificate"));
    }
    Ok(certs)
}

/// Parses a certificate chain and its key, so that a bad file is an error at start, not at
/// the first connection.
fn check_pem(cert: &[u8], key: &[u8]) -> Result<Parsed, String> {
    use rustls::pki_types::pem::PemObject;
    let certs = certificates(cert, "TLS certificate")?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| format!("the TLS key is not a PEM private key: {e}"))?;
    Ok((certs, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_tls_settings_are_errors_that_say_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("cs-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").expect("write");
        let only_cert = TlsFiles {
            cert: Some(junk.clone()),
            ..Default::default()
        };
        assert_eq!(
            only_cert.server(&[b"h2"], true).expect_err("cert alone"),
            "--tls-cert and --tls-key go together"
        );
        let ca_only = TlsFiles {
            ca: Some(junk.clone()),
            ..Default::default()
        };
        assert!(
            ca_only
                .server(&[b"h2"], true)
                .expect_err("ca alone")
                .contains("needs --tls-cert")
        );
        let junk_pair = TlsFiles {
            cert: Some(junk.clone()),
            key: Some(junk.clone()),
            ca: None,
        };
        let e = junk_pair.server(&[b"h2"], true).expect_err("junk");
        assert!(e.contains("holds no certificate"), "{e}");
        let missing = TlsFiles {
            cert: Some(dir.join("absent.pem")),
            key: Some(junk),
            ca: None,
        };
        let e = missing.server(&[b"http/1.1"], false).expect_err("missing");
        assert!(e.contains("cannot read the certificate"), "{e}");
        assert_eq!(
            TlsFiles::default()
                .server(&[b"h2"], true)
                .map(|s| s.is_none()),
            Ok(true)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
