//! One way to lock in the service: std's `Mutex` / `RwLock` through these helpers, with one
//! poisoning policy — recover the guard. Every critical section in millrace is short and keeps
//! its data consistent at every step (counters, maps, a published book swapped whole), so a panic
//! in one holder (already reported, its task restarted by its supervisor) must not take every
//! later reader down with it.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

/// Locks `m`, recovering from poisoning.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `l`, recovering from poisoning.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `l`, recovering from poisoning.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` until notified, recovering from poisoning.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` until notified or `d` has passed, recovering from poisoning.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    d: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, d).unwrap_or_else(PoisonError::into_inner).0
}

/// Waits on `cv` while `condition` holds, recovering from poisoning.
pub fn wait_while<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    condition: impl FnMut(&mut T) -> bool,
) -> MutexGuard<'a, T> {
    cv.wait_while(guard, condition).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` while `condition` holds, at most `d`, recovering from poisoning.
pub fn wait_timeout_while<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    d: Duration,
    condition: impl FnMut(&mut T) -> bool,
) -> MutexGuard<'a, T> {
    cv.wait_timeout_while(guard, d, condition).unwrap_or_else(PoisonError::into_inner).0
}
