//! The official A2A dialects (docs/PROTOCOL.md §10): 0.3 on `POST /api/v1/a2a/{agent}/jsonrpc/v0.3`
//! and 1.0 on `…/jsonrpc/v1`, over the same runtime as the seed. One folder for both: they
//! share the method semantics and error codes and differ in names and shapes, which
//! [`Version`] picks wherever they do.

pub(crate) mod bindings;
pub(crate) mod card;
pub(crate) mod client;
pub(crate) mod errors;
pub(crate) mod ops;
pub(crate) mod params;
pub(crate) mod pb;
pub(crate) mod pbin;
pub(crate) mod pbout;
pub(crate) mod pbvalue;
pub(crate) mod render;
pub(crate) mod token;
pub(crate) mod upstream;
pub(crate) mod webhook;

pub(crate) use bindings::jsonrpc::dispatch;

/// Which official version a path serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Version {
    /// A2A 0.3 (JSON schema shapes, `kind` discriminators, slash method names).
    V03,
    /// A2A 1.0 (ProtoJSON shapes, PascalCase method names).
    V10,
}

/// The 1.0 methods (S10 §9.4), in the specification's order: the names of [`ops::TABLE`].
pub(crate) const METHODS_10: [&str; 11] = {
    let mut out = [""; 11];
    let mut i = 0;
    while i < ops::TABLE.len() {
        out[i] = ops::TABLE[i].v10;
        i += 1;
    }
    out
};

/// The 0.3 methods (J03), in the specification's order: the 0.3 names of [`ops::TABLE`]
/// (a count that does not match fails the build).
pub(crate) const METHODS_03: [&str; 10] = {
    let mut out = [""; 10];
    let (mut i, mut j) = (0, 0);
    while i < ops::TABLE.len() {
        if let Some(m) = ops::TABLE[i].v03 {
            out[j] = m;
            j += 1;
        }
        i += 1;
    }
    out
};

impl Version {
    /// Both, 1.0 first.
    pub(crate) const ALL: [Version; 2] = [Version::V10, Version::V03];

    /// `Major.Minor`.
    pub(crate) fn number(self) -> &'static str {
        match self {
            Self::V03 => "0.3",
            Self::V10 => "1.0",
        }
    }

    /// The path under `/api/v1/a2a/{agent}/` that serves it.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::V03 => "jsonrpc/v0.3",
            Self::V10 => "jsonrpc/v1",
        }
    }

    /// The version named by an `A2A-Version` value (`Major.Minor[.patch]`); an absent or
    /// empty value means 0.3 (S10 §3.6.2). `None`: a version this server does not speak.
    pub(crate) fn of_header(value: Option<&str>) -> Option<Self> {
        let value = value.map(str::trim).unwrap_or("");
        if value.is_empty() {
            return Some(Self::V03);
        }
        let number =
            |p: &str| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit());
        let mut parts = value.split('.');
        let (major, minor) = (parts.next()?, parts.next()?);
        let patch_ok = parts.next().is_none_or(number);
        if !number(major) || !number(minor) || !patch_ok || parts.next().is_some() {
            return None;
        }
        match (major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?) {
            (0, 3) => Some(Self::V03),
            (1, 0) => Some(Self::V10),
            _ => None,
        }
    }

    /// Its method table.
    pub(crate) fn methods(self) -> &'static [&'static str] {
        match self {
            Self::V03 => &METHODS_03,
            Self::V10 => &METHODS_10,
        }
    }

    /// The metric label of a method it serves.
    pub(crate) fn method_label(self, method: &str) -> Option<&'static str> {
        self.methods().iter().copied().find(|m| *m == method)
    }

    /// Whether a method answers with a stream.
    pub(crate) fn is_streaming(self, method: &str) -> bool {
        match self {
            Self::V03 => matches!(method, "message/stream" | "tasks/resubscribe"),
            Self::V10 => matches!(method, "SendStreamingMessage" | "SubscribeToTask"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_headers_name_major_and_minor_and_ignore_the_patch() {
        for (value, version) in [
            (None, Some(Version::V03)),
            (Some(""), Some(Version::V03)),
            (Some("0.3"), Some(Version::V03)),
            (Some("0.3.0"), Some(Version::V03)),
            (Some("1.0"), Some(Version::V10)),
            (Some(" 1.0.1 "), Some(Version::V10)),
            (Some("1"), None),
            (Some("1.1"), None),
            (Some("2.0"), None),
            (Some("1.0."), None),
            (Some("1.0.x"), None),
            (Some("1.0.0.0"), None),
            (Some("v1.0"), None),
            (Some("+1.0"), None),
            (Some("1.-0"), None),
        ] {
            assert_eq!(Version::of_header(value), version, "{value:?}");
        }
    }

    #[test]
    fn the_method_tables_do_not_overlap() {
        for m in METHODS_10 {
            assert!(!METHODS_03.contains(&m));
        }
        assert!(Version::V10.is_streaming("SendStreamingMessage"));
        assert!(!Version::V10.is_streaming("message/stream"));
        assert!(Version::V03.is_streaming("tasks/resubscribe"));
    }
}
