//! What more than one of millrace's load tools needs.

pub mod child;
pub mod procfs;

/// A child process, killed (and reaped) however the run that started it ends.
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
