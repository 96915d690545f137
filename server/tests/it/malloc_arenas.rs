//! The long-running commands re-execute themselves in place with fewer glibc malloc arenas
//! (`server::malloc`), and keep a value the environment already has.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the child when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `millrace sim` on a free port, with `MALLOC_ARENA_MAX` as given (`None`: unset).
fn sim(arenas: Option<&str>) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_millrace"));
    cmd.args(["sim", "--addr", "127.0.0.1:0"]).stdout(Stdio::null()).stderr(Stdio::null());
    cmd.env_remove(server::malloc::VAR);
    if let Some(v) = arenas {
        cmd.env(server::malloc::VAR, v);
    }
    Running(cmd.spawn().expect("the binary starts"))
}

/// The value of `MALLOC_ARENA_MAX` in the process's environment, once it has one (at most 10 s).
fn arenas_of(pid: u32) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let prefix = format!("{}=", server::malloc::VAR);
    while Instant::now() < deadline {
        if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
            let found = environ
                .split(|&b| b == 0)
                .filter_map(|v| std::str::from_utf8(v).ok())
                .find_map(|v| v.strip_prefix(&prefix).map(str::to_owned));
            if found.is_some() {
                return found;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn a_long_running_command_runs_with_one_malloc_arena() {
    let child = sim(None);
    // The same process (exec in place), now with the variable set.
    assert_eq!(arenas_of(child.0.id()).as_deref(), Some(server::malloc::ARENAS));
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.0.id())).unwrap();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
    assert_eq!(args[1..], [&b"sim"[..], b"--addr", b"127.0.0.1:0"], "same arguments");
}

#[test]
fn an_operators_malloc_arena_setting_is_kept() {
    let child = sim(Some("4"));
    assert_eq!(arenas_of(child.0.id()).as_deref(), Some("4"));
}
