//! A `millrace` child process under a load tool: a free port, the start with a configuration
//! file, the wait for `/healthz`, and its `/metrics`.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use server::config::Config;

use crate::KillOnDrop;

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The `millrace` binary beside the running tool (`target/<profile>/millrace`).
pub fn millrace_beside_me() -> anyhow::Result<PathBuf> {
    Ok(std::env::current_exe()?.with_file_name(format!("millrace{}", std::env::consts::EXE_SUFFIX)))
}

/// Starts `millrace <args> --config <dir>/<name>.toml` (`RUST_LOG=warn`), its log in
/// `<dir>/<name>.log`.
pub fn start(
    bin: &Path,
    dir: &Path,
    name: &str,
    args: &[&str],
    config: &Config,
) -> anyhow::Result<KillOnDrop> {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml::to_string(config)?)?;
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    args.extend([std::ffi::OsStr::new("--config"), path.as_os_str()]);
    start_args(bin, dir, name, &args)
}

/// Starts `millrace <args>` (`RUST_LOG=warn`), its log in `<dir>/<name>.log`.
pub fn start_args(
    bin: &Path,
    dir: &Path,
    name: &str,
    args: &[&std::ffi::OsStr],
) -> anyhow::Result<KillOnDrop> {
    KillOnDrop::spawn(
        Command::new(bin)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log")))?),
    )
    .with_context(|| format!("cannot start {}", bin.display()))
}

/// Waits (at most 60 s) until `GET /healthz` on 127.0.0.1:`port` answers 2xx.
pub async fn wait_healthy(port: u16) -> anyhow::Result<()> {
    wait_ok(&format!("http://127.0.0.1:{port}/healthz")).await
}

/// Waits (at most 60 s) until `GET url` answers 2xx.
pub async fn wait_ok(url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = reqwest::get(url).await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("{url} did not answer 2xx within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /metrics` of the server at `addr` (blocking): sample name (with labels) -> value.
pub fn metrics(addr: SocketAddr) -> anyhow::Result<HashMap<String, f64>> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .context("connect for /metrics")?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).context("no HTTP body")?;
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

/// One sample of [`metrics`]' answer (0 when absent).
pub fn metric(m: &HashMap<String, f64>, name: &str) -> f64 {
    m.get(name).copied().unwrap_or(0.0)
}
