//! The real `a2ad` binary as a child process: its configuration in a temporary file, its
//! stderr captured (for log checks), stopped by its pid.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_a2ad");

/// A temporary directory, removed on drop.
pub struct TempDir {
    pub path: std::path::PathBuf,
}

impl TempDir {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(format!("a2ad-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path).expect("mkdir");
        Self { path }
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running `a2ad` process.
pub struct Binary {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Ends when the process closes stderr (at exit).
    reader: Option<std::thread::JoinHandle<()>>,
    _dir: TempDir,
}

impl Binary {
    /// Starts `a2ad --config <file with config_text> --listen 127.0.0.1:0`, with extra
    /// environment variables, optionally under a wrapper command (e.g. `prlimit ...`).
    pub fn start(config_text: &str, envs: &[(&str, &str)], wrapper: &[&str]) -> Self {
        Self::start_with(config_text, envs, wrapper, &[])
    }

    /// [`Binary::start`] with extra command-line arguments after the usual ones.
    pub fn start_with(
        config_text: &str,
        envs: &[(&str, &str)],
        wrapper: &[&str],
        extra: &[&str],
    ) -> Self {
        let dir = TempDir::new();
        let path = dir.path.join("a2ad.toml");
        std::fs::write(&path, config_text).expect("write config");
        let path = path.display().to_string();
        let mut args: Vec<&str> = wrapper.to_vec();
        args.extend([BIN, "--config", &path, "--listen", "127.0.0.1:0"]);
        args.extend(extra);
        let mut cmd = Command::new(args[0]);
        // Its own folder: the default store (./a2ad-data/log) goes there.
        cmd.current_dir(&dir.path)
            .args(&args[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn a2ad");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut err_pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().expect("lock").extend_from_slice(&buf[..n]);
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut base = None;
        for line in lines.by_ref() {
            let line = line.expect("line");
            // `http://…`, or `https://…` with `[server.tls]`.
            if let Some(at) = line.find("listening on http") {
                base = Some(line[at + "listening on ".len()..].trim().to_string());
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        let Some(base) = base else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "a2ad exited before listening; stderr: {}",
                String::from_utf8_lossy(&stderr.lock().expect("lock"))
            );
        };
        Self {
            child,
            base,
            stderr,
            reader: Some(reader),
            _dir: dir,
        }
    }

    /// What the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("lock")).into_owned()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Rewrites its configuration file and sends SIGHUP (a reload, docs/CONFIG.md).
    pub fn reload(&self, config_text: &str) {
        std::fs::write(self._dir.path.join("a2ad.toml"), config_text).expect("rewrite config");
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGKILL (a crash: nothing runs on the way out); returns stderr.
    pub fn kill9(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.stderr()
    }

    /// SIGTERM, then waits (up to 30 s) for the exit; returns the exit code and stderr.
    pub fn stop(self) -> (i32, String) {
        self.stop_within(Duration::from_secs(30))
    }

    /// SIGTERM, then waits up to `limit` for the exit (panics past it); returns the exit
    /// code and stderr.
    pub fn stop_within(mut self, limit: Duration) -> (i32, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let end = Instant::now() + limit;
        let code = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < end, "a2ad did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        (code, self.stderr())
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
