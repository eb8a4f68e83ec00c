//! TLS on the listener (`[server.tls]`): rustls with TLS 1.3 preferred and 1.2 accepted,
//! ALPN `h2` then `http/1.1`, optional client certificates (mTLS), and the certificate
//! files reloaded without a restart when they change.
//!
//! The files are read at start-up (a bad one refuses the start, naming it) and then checked
//! every `reload_check_seconds`, or at once on SIGHUP ([`crate::ServerHandle::reload_tls`]):
//! when a file's modification time or size changed, the whole set is loaded again and, if
//! it is good, served to every new connection; connections already open keep the
//! certificate they shook hands with. A set that does not load is logged and the old one
//! kept, so a half-copied certificate never takes the server down.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::{ConfigError, TlsConfig};

/// The listener's TLS settings, as loaded last.
pub(crate) struct Tls {
    settings: TlsConfig,
    current: RwLock<TlsAcceptor>,
    /// The files' modification times and sizes when they were loaded.
    stamps: Mutex<Vec<Stamp>>,
}

/// A file's modification time and size, or nothing when it cannot be read.
type Stamp = Option<(SystemTime, u64)>;

impl Tls {
    /// Loads the files of `[server.tls]`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key and the file when one is missing, unreadable, not
    /// PEM, expired or not yet valid, or when the key does not belong to the certificate.
    pub(crate) fn load(settings: &TlsConfig) -> Result<Self, ConfigError> {
        let stamps = stamps(settings);
        let config = server_config(settings)?;
        Ok(Self {
            settings: settings.clone(),
            current: RwLock::new(TlsAcceptor::from(Arc::new(config))),
            stamps: Mutex::new(stamps),
        })
    }

    /// The acceptor for a new connection: the settings loaded last.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        match self.current.read() {
            Ok(a) => a.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Loads the files again if any changed since they were loaded. `Ok(true)` when new
    /// settings are now served.
    ///
    /// # Errors
    /// When the changed files do not load; the settings served stay as they were (the
    /// check is repeated at the next change).
    pub(crate) fn reload_if_changed(&self) -> Result<bool, ConfigError> {
        let now = stamps(&self.settings);
        {
            let mut seen = self.stamps.lock().unwrap_or_else(|p| p.into_inner());
            if *seen == now {
                return Ok(false);
            }
            // Whatever happens next, this state of the files has been tried.
            seen.clone_from(&now);
        }
        let config = server_config(&self.settings)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) =
            TlsAcceptor::from(Arc::new(config));
        Ok(true)
    }

    /// How often the files are checked.
    pub(crate) fn reload_check(&self) -> std::time::Duration {
        self.settings.reload_check()
    }

    /// Checks the files now; logs what happened.
    pub(crate) fn reload_logged(&self) {
        match self.reload_if_changed() {
            Ok(true) => tracing::info!("TLS certificate and key reloaded"),
            Ok(false) => {}
            Err(e) => tracing::error!(
                error = %e,
                "TLS files changed but do not load; still serving the previous certificate"
            ),
        }
    }
}

fn stamps(settings: &TlsConfig) -> Vec<Stamp> {
    [
        Some(&settings.cert_file),
        Some(&settings.key_file),
        settings.client_ca_file.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|path| {
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    })
    .collect()
}

/// The provider every TLS setting here is built with (aws-lc-rs, as reqwest's client).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn server_config(settings: &TlsConfig) -> Result<ServerConfig, ConfigError> {
    let cert_key = "server.tls.cert_file";
    let key_key = "server.tls.key_file";
    let certs = certificates(&settings.cert_file, cert_key)?;
    if let Some(leaf) = certs.first() {
        current(leaf, &settings.cert_file, cert_key)?;
    }
    let key = PrivateKeyDer::from_pem_file(&settings.key_file).map_err(|e| {
        file_error(
            key_key,
            &settings.key_file,
            &format!("no private key (PKCS#8, PKCS#1 or SEC1 PEM) could be read: {e}"),
        )
    })?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| ConfigError::key("server.tls", e.to_string()))?;
    let builder = match &settings.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let ca_key = "server.tls.client_ca_file";
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca_file, ca_key)? {
                roots
                    .add(cert)
                    .map_err(|e| file_error(ca_key, ca_file, &e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if settings.client_cert_required {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier
                .build()
                .map_err(|e| file_error(ca_key, ca_file, &e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        let why = match e {
            rustls::Error::InconsistentKeys(_) => {
                format!(
                    "the key does not belong to the certificate in {}",
                    settings.cert_file
                )
            }
            other => other.to_string(),
        };
        file_error(key_key, &settings.key_file, &why)
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The certificates of a PEM file: at least one.
fn certificates(path: &str, key: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| file_error(key, path, &format!("cannot read PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(key, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// Refuses a certificate outside its validity period.
fn current(cert: &CertificateDer<'_>, path: &str, key: &str) -> Result<(), ConfigError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| file_error(key, path, &format!("not an X.509 certificate: {e}")))?;
    let validity = parsed.validity();
    if !validity.is_valid() {
        return Err(file_error(
            key,
            path,
            &format!(
                "the certificate is valid from {} to {}, not now",
                validity.not_before, validity.not_after
            ),
        ));
    }
    Ok(())
}

fn file_error(key: &str, path: &str, why: &str) -> ConfigError {
    let shown = Path::new(path).display();
    ConfigError::key(key, format!("{shown}: {why}"))
}
