//! What the helper reads of the machine: /proc/meminfo, in one place (the automatic
//! expert-cache budget, `coli doctor` and `coli bench` use it).

/// A field of /proc/meminfo ("MemTotal", "MemAvailable") in bytes; None where there is
/// no such file (not Linux) or field.
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, field)
}

fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_in_bytes() {
        let text = "MemTotal:       16318644 kB\nMemFree:          1000 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_meminfo(text, "MemTotal"), Some(16318644 * 1024));
        assert_eq!(parse_meminfo(text, "MemAvailable"), Some(8000000 * 1024));
        assert_eq!(parse_meminfo(text, "Mem"), None);
        assert_eq!(parse_meminfo(text, "SwapTotal"), None);
    }
}
