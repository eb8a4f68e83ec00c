//! What the store writes is private: files mode 0600, the directories it makes 0700,
//! whatever the umask (docs/CONFIG.md, `[store] path`). Every file holds task data, and
//! perhaps webhook secrets.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Creates `dir` and any missing parents, each mode 0700 (as the umask allows, then set):
/// the store's directories are a2ad's alone.
pub(super) fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

/// Options that create a file mode 0600.
pub(super) fn file() -> std::fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut options = std::fs::OpenOptions::new();
    options.mode(0o600);
    options
}
