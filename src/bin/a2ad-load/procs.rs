//! Server processes: start a2ad or the floor server pinned to CPUs, read their RSS and CPU
//! time from /proc, and stop them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A server process started by the tool.
pub struct ServerProc {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ServerProc {
    /// Starts `program args...` under `taskset -c cpus` (when given) and waits for its
    /// `listening on http://HOST:PORT` line.
    pub fn start(program: &str, args: &[String], cpus: Option<&str>) -> Result<Self, String> {
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(program);
                c
            }
            None => Command::new(program),
        };
        let mut child = cmd
            .args(args)
            // The level a user's server runs at unless told otherwise (what it costs is
            // part of what is measured).
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let line = line.map_err(|e| e.to_string())?;
            if let Some(at) = line.find("listening on http://") {
                let addr = line[at + "listening on http://".len()..].trim();
                let addr = addr.parse().map_err(|_| format!("bad address {addr:?}"))?;
                std::thread::spawn(move || for _ in lines {});
                return Ok(Self { child, addr });
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!("{program} exited before listening"))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (current RSS, peak RSS) in bytes.
pub fn rss(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// User + system CPU seconds of a process so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Pins this process (all its threads) to `cpus` with taskset.
pub fn pin_self(cpus: &str) -> Result<(), String> {
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?
        .success();
    if ok {
        Ok(())
    } else {
        Err(format!("taskset -c {cpus} failed"))
    }
}

/// How many CPUs a list such as `0`, `1-3` or `0,2` names.
pub fn cpu_count(cpus: &str) -> usize {
    cpus.split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum::<usize>()
        .max(1)
}
