//! TLS (rustls, the aws-lc-rs provider) for what leaves a process: its listener
//! (`--tls-cert-file` and `--tls-key-file`, PEM) and its calls to the other processes of a
//! deployment, the participants and the token service (`--tls-ca-file`: the CA, or the
//! self-signed certificate, those processes present). Optional: without the files a process
//! speaks plain HTTP, as on loopback in the tests and the bench.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Every certificate of a PEM file.
///
/// # Errors
/// The file cannot be read, or holds no certificate (the message names it).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// The listener's TLS: the certificate chain and its private key (PEM files).
///
/// # Errors
/// A file cannot be read or parsed, or the key does not fit the certificate.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("TLS certificate {}: {e}", cert.display()))?;
    Ok(Arc::new(config))
}

/// The TLS of calls to the other processes: trust the certificates of `ca` (PEM).
///
/// # Errors
/// The file cannot be read or holds no usable certificate.
pub fn client_config(ca: &Path) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// An HTTP client for calls to the other processes, answering within `timeout`: trusting `ca`
/// when given (then `https://` URLs work), plain HTTP otherwise.
///
/// # Errors
/// The CA file is unusable, or the client cannot be built.
pub fn http_client(
    ca: Option<&Path>,
    timeout: std::time::Duration,
    idle_per_host: usize,
) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(idle_per_host);
    if let Some(ca) = ca {
        builder = builder.use_preconfigured_tls(client_config(ca)?);
    }
    builder.build().map_err(|e| format!("HTTP client: {e}"))
}
