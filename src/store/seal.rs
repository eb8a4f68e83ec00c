//! Secrets sealed at rest (`[secrets]`): a push configuration's HMAC secret, token,
//! `Authorization` credentials and extra header values are stored as
//! `a2ad-sealed:v1:<key id>:<base64url(nonce ‖ ciphertext ‖ tag)>` — AES-256-GCM
//! (aws-lc-rs) with a random 96-bit nonce per value and the field's name as associated
//! data, so a sealed value cannot be moved to another field. The key id is the first four
//! bytes of the key's SHA-256, in hex: values sealed with an earlier key (`old_keys`) are
//! still read, and each configuration is sealed with the current key the next time it is
//! written (every delivery writes it). A value that is not sealed (written before a key was
//! configured) is read as it is.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use sha2::{Digest, Sha256};

use crate::config::Config;

const PREFIX: &str = "a2ad-sealed:v1:";

/// The configured keys; with none, values pass through in clear.
#[derive(Default)]
pub(crate) struct Sealer {
    /// The current key first, then the old ones.
    keys: Vec<(String, LessSafeKey)>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|(id, _)| id))
            .finish()
    }
}

/// Why a sealed value cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unsealed {
    /// Sealed with a key that is not configured (its id).
    UnknownKey(String),
    /// The key id is known but the value does not open with it (altered, or another key
    /// with the same id).
    Invalid,
}

impl std::fmt::Display for Unsealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownKey(id) => write!(
                f,
                "secrets in the store are sealed with key {id}, which is not configured: set [secrets] key (or list it in old_keys) to the key they were sealed with"
            ),
            Self::Invalid => f.write_str(
                "a sealed secret in the store does not open with the configured key of its id: the key is wrong or the value was altered",
            ),
        }
    }
}

impl Sealer {
    /// The keys of `[secrets]` (already checked by `Config::validated`).
    pub(crate) fn for_config(config: &Config) -> Self {
        let Ok(keys) = config.secrets.resolve() else {
            return Self::default();
        };
        let keys = keys
            .current
            .into_iter()
            .chain(keys.old)
            .filter_map(|bytes| {
                let id = key_id(&bytes);
                UnboundKey::new(&AES_256_GCM, &bytes)
                    .ok()
                    .map(|k| (id, LessSafeKey::new(k)))
            })
            .collect();
        Self { keys }
    }

    /// Whether values are sealed (a key is configured).
    pub(crate) fn seals(&self) -> bool {
        !self.keys.is_empty()
    }

    /// `value` sealed with the current key for `field`; in clear without a key.
    pub(crate) fn seal(&self, field: &str, value: &str) -> String {
        let Some((id, key)) = self.keys.first() else {
            return value.to_string();
        };
        let mut nonce = [0u8; NONCE_LEN];
        if aws_lc_rs::rand::fill(&mut nonce).is_err() {
            // No randomness from the system (practically never): a nonce must not be
            // reused and the value must not be stored in clear, so nothing is stored.
            tracing::error!(
                field,
                "no randomness to seal a secret with; it is not stored"
            );
            return String::new();
        }
        let mut data = value.as_bytes().to_vec();
        if key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(field.as_bytes()),
                &mut data,
            )
            .is_err()
        {
            return String::new();
        }
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        format!("{PREFIX}{id}:{}", B64.encode(out))
    }

    /// A stored value in clear.
    ///
    /// # Errors
    /// [`Unsealed`] when it is sealed and does not open with the configured keys.
    pub(crate) fn open(&self, field: &str, stored: &str) -> Result<String, Unsealed> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_string());
        };
        let (id, body) = rest.split_once(':').ok_or(Unsealed::Invalid)?;
        let key = self
            .keys
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, key)| key)
            .ok_or_else(|| Unsealed::UnknownKey(id.to_string()))?;
        let raw = B64.decode(body).map_err(|_| Unsealed::Invalid)?;
        let (nonce, sealed) = raw.split_at_checked(NONCE_LEN).ok_or(Unsealed::Invalid)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unsealed::Invalid)?;
        let mut data = sealed.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(field.as_bytes()), &mut data)
            .map_err(|_| Unsealed::Invalid)?;
        String::from_utf8(plain.to_vec()).map_err(|_| Unsealed::Invalid)
    }
}

fn key_id(key: &[u8; 32]) -> String {
    Sha256::digest(key)
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(key: &str, old: &[&str]) -> Sealer {
        let mut c = Config::default();
        c.secrets.key = Some(key.into());
        c.secrets.old_keys = old.iter().map(|k| (*k).to_string()).collect();
        Sealer::for_config(&c)
    }

    const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const K2: &str = "HxwdHBsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA=";

    #[test]
    fn values_round_trip_and_never_appear_in_clear() {
        let s = sealer(K1, &[]);
        let sealed = s.seal("sec", "hunter2-the-secret");
        assert!(sealed.starts_with(PREFIX), "{sealed}");
        assert!(!sealed.contains("hunter2"), "{sealed}");
        assert_ne!(
            sealed,
            s.seal("sec", "hunter2-the-secret"),
            "a fresh nonce each time"
        );
        assert_eq!(s.open("sec", &sealed).as_deref(), Ok("hunter2-the-secret"));
        assert_eq!(
            s.open("sec", "plain").as_deref(),
            Ok("plain"),
            "clear values pass"
        );
    }

    #[test]
    fn a_value_opens_only_in_its_field_with_its_key_and_unaltered() {
        let s = sealer(K1, &[]);
        let sealed = s.seal("tok", "t0ken");
        assert_eq!(
            s.open("sec", &sealed),
            Err(Unsealed::Invalid),
            "moved to another field"
        );
        let mut altered = sealed.clone();
        let last = altered
            .pop()
            .map_or('A', |c| if c == 'A' { 'B' } else { 'A' });
        altered.push(last);
        assert_eq!(s.open("tok", &altered), Err(Unsealed::Invalid));
        let other = sealer(K2, &[]);
        assert!(matches!(
            other.open("tok", &sealed),
            Err(Unsealed::UnknownKey(_))
        ));
        // Rotation: K2 current, K1 old — the old value opens, new ones use K2.
        let rotated = sealer(K2, &[K1]);
        assert_eq!(rotated.open("tok", &sealed).as_deref(), Ok("t0ken"));
        let resealed = rotated.seal("tok", "t0ken");
        assert!(matches!(
            s.open("tok", &resealed),
            Err(Unsealed::UnknownKey(_))
        ));
        // No key: clear in, clear out.
        let none = Sealer::default();
        assert_eq!(none.seal("sec", "x"), "x");
    }
}
