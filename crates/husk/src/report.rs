//! The one way the CLI reports an error: `husk: ` and the error's whole chain of causes on one
//! line, control characters escaped (messages carry names from sandboxes, servers and the
//! database, which must not drive the terminal).

use crate::units::without_controls;

/// Prints `husk: MESSAGE` to stderr. Line breaks stay (a build's log tail reads as lines);
/// every other control character in each line is escaped.
pub fn say(message: &str) {
    eprintln!("husk: {}", escaped(message));
}

fn escaped(message: &str) -> String {
    message
        .split('\n')
        .map(without_controls)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A typed error and its causes (`outer: cause: root cause`).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    husk_core::error_chain(e)
}

/// An `anyhow` error and its causes, as [`chain`] gives a typed one.
pub fn anyhow(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("opening the workspace")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn lines_stay_lines_and_other_controls_are_escaped() {
        assert_eq!(escaped("step 3 failed:\nexit 1"), "step 3 failed:\nexit 1");
        assert_eq!(escaped("a\u{1b}[2Jb\r"), "a\\u{1b}[2Jb\\r");
    }

    #[test]
    fn typed_and_anyhow_errors_read_the_same() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert_eq!(chain(&Outer(io())), "opening the workspace: no such file");
        let any = anyhow::Error::new(Outer(io()));
        assert_eq!(anyhow(&any), "opening the workspace: no such file");
    }
}
