//! What more than one of millrace's load tools needs.

pub mod child;
pub mod procfs;

/// A child process in a process group of its own, killed (and reaped) with everything it started
/// however the run that started it ends: a wrapper given as a tool's `--bin` (a profiler, say)
/// that runs the server as its own child instead of `exec`-ing it leaves no server behind.
pub struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    /// Spawns `command` as the leader of a new process group.
    pub fn spawn(command: &mut std::process::Command) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        command.process_group(0).spawn().map(KillOnDrop)
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // the group first, while the leader, not yet reaped, keeps the group's id from being
        // reused; then the leader, should the group kill have failed
        use rustix::process::{kill_process_group, Pid, Signal};
        let _ = kill_process_group(Pid::from_child(&self.0), Signal::KILL);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::KillOnDrop;

    /// Whether `pid` still runs (a zombie waiting for its reaper does not).
    fn running(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')').next().is_some_and(|s| !s.trim_start().starts_with('Z'))
        })
    }

    #[test]
    fn dropping_kills_what_the_child_started_too() {
        // a wrapper that does not `exec`: the shell keeps running, its child is the real work
        let mut child = KillOnDrop::spawn(
            Command::new("sh").args(["-c", "sleep 300 & echo $!; wait"]).stdout(Stdio::piped()),
        )
        .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let grandchild = line.trim().to_owned();
        assert!(running(&grandchild), "sleep {grandchild} runs under the shell");
        drop(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(&grandchild) {
            assert!(Instant::now() < deadline, "sleep {grandchild} outlived its group's owner");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
