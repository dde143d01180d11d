//! Human units on the command line: sizes (`512M`, `1GiB`) and durations (`30s`, `500ms`).

use std::time::Duration;

/// Parses a size: a number with an optional binary unit (K, M, G, T, with or without `i`/`B`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 512M, 1G, 100k"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "ki" | "kib" => 1 << 10,
        "m" | "mb" | "mi" | "mib" => 1 << 20,
        "g" | "gb" | "gi" | "gib" => 1 << 30,
        "t" | "tb" | "ti" | "tib" => 1 << 40,
        _ => return Err(format!("invalid size unit in {s:?}: use K, M, G or T")),
    };
    let bytes = n * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// Formats bytes the way the limits were most likely given: `512 MiB`, `1 GiB`, `1.5 GiB`.
/// `text` with control characters escaped (`\n`, `\u{1b}`), everything else as is: no text
/// from a sandbox, the database or the command line may drive the terminal.
pub fn without_controls(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_debug().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// Parses a CPU quota given in CPUs (`0.5`, `2`) into millicpus.
pub fn parse_cpus(s: &str) -> Result<u64, String> {
    let cpus: f64 = s
        .parse()
        .ok()
        .filter(|c: &f64| c.is_finite() && *c > 0.0 && *c <= 1024.0)
        .ok_or_else(|| format!("invalid --cpus {s:?}: expected a positive number like 0.5 or 2"))?;
    Ok((cpus * 1000.0).round() as u64)
}

pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if bytes % size == 0 {
                format!("{} {name}", bytes / size)
            } else {
                format!("{v:.1} {name}")
            };
        }
    }
    format!("{bytes} B")
}

/// Parses a duration: plain seconds or a number with ms, s, m, h or d.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 30s, 500ms, 2m, 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?}: use ms, s, m, h or d"
            ))
        }
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 1e9 {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration compactly: `30s`, `1.5s`, `500ms`, `2m`, `1h`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("100k"), Ok(100 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(format_size(512 << 20), "512 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
        assert_eq!(format_size(100), "100 B");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("3w").is_err());
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
    }
}
