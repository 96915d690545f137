//! `/proc` readers the load tools measure a process and the machine with (Linux).

use std::time::Duration;

/// Raises `RLIMIT_NOFILE` to its hard limit (thousands of sockets per process); returns the new
/// soft limit.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    let (Some(cur), max) = (r.current, r.maximum) else { return u64::MAX };
    if max.is_none_or(|m| cur < m)
        && setrlimit(Resource::Nofile, Rlimit { current: max, maximum: max }).is_ok()
    {
        return max.unwrap_or(u64::MAX);
    }
    cur
}

/// Clock ticks per second of `/proc`'s CPU times.
fn clock_ticks() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// Resident set size of `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The anonymous part of [`rss_bytes`] (`RssAnon`: heap and stacks, without the binary's and
/// other files' pages).
pub fn rss_anon_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "RssAnon:")
}

/// The size of `pid`'s `[heap]` mapping (the main malloc arena's extent) and how much of it is
/// resident, in bytes, from `/proc/<pid>/smaps`. A process whose live heap is flat can still show
/// RSS growing while its allocator touches pages of that extent it had not touched before; the
/// extent bounds that growth.
pub fn heap_mapping(pid: u32) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let fields = smaps.lines().skip_while(|l| !l.ends_with("[heap]")).skip(1);
    let kb = |l: &str| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
    let (mut size, mut rss) = (None, None);
    // the mapping's `Field: value` lines, up to the next mapping's address range
    for l in fields.take_while(|l| l.contains(':') && !l.contains('-')) {
        if l.starts_with("Size:") {
            size = kb(l);
        } else if l.starts_with("Rss:") {
            rss = kb(l);
        }
    }
    Some((size? * 1024, rss? * 1024))
}

/// A `kB` field of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// User + system CPU time of `pid` (all threads), from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after it are space-separated.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14, stime 15 (1-based in proc(5)).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let tck = clock_ticks();
    Some(Duration::from_micros((utime + stime) * 1_000_000 / tck))
}

/// CPU time the whole machine spent busy (every state of the `cpu` line of `/proc/stat` but
/// idle and iowait), so a window can tell how much CPU processes other than ours took.
pub fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user)
    let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7).unwrap_or(&0);
    let tck = clock_ticks();
    Some(Duration::from_micros(busy * 1_000_000 / tck))
}

/// The three load averages of `/proc/loadavg`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_heap_mapping_of_this_process_is_read() {
        // the test harness's main thread allocates with glibc's main arena: a `[heap]` mapping
        let (size, rss) = super::heap_mapping(std::process::id()).expect("a [heap] mapping");
        assert!(size > 0 && size % 4096 == 0, "size {size}");
        assert!(rss > 0 && rss <= size, "size {size}, rss {rss}");
        assert_eq!(super::heap_mapping(u32::MAX), None, "no such process");
    }
}
