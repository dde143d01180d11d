//! Environment variables as every layer accepts them: one checked type instead of a check per
//! caller. A name is non-empty and has no `=` or NUL (either would make a different variable,
//! or none, in the process's `environ`); a value has no NUL; all of them together fit in
//! [`MAX_ENV_BYTES`] (they travel in one frame to the agent and into every process's
//! environment).

/// Largest total size of a set of environment variables (names, values, `=` and NUL each).
pub const MAX_ENV_BYTES: usize = 256 << 10;

/// Why a set of environment variables was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("invalid environment variable name {0:?}")]
    Name(String),
    #[error("environment variable {0:?} contains a NUL byte")]
    Value(String),
    #[error("environment variables take {0} bytes, more than the limit of {MAX_ENV_BYTES}")]
    TooLarge(usize),
}

/// Checked environment variables, in order (a later one of the same name wins where they are
/// applied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvVars(Vec<(String, String)>);

impl EnvVars {
    /// `vars`, if every one is valid and all fit in [`MAX_ENV_BYTES`].
    pub fn new(vars: Vec<(String, String)>) -> Result<EnvVars, EnvError> {
        EnvVars::check(&vars)?;
        Ok(EnvVars(vars))
    }

    /// Checks `vars` as [`EnvVars::new`] does, for callers that keep their own vector.
    pub fn check(vars: &[(String, String)]) -> Result<(), EnvError> {
        let mut bytes = 0usize;
        for (k, v) in vars {
            if k.is_empty() || k.contains(['=', '\0']) {
                return Err(EnvError::Name(k.clone()));
            }
            if v.contains('\0') {
                return Err(EnvError::Value(k.clone()));
            }
            bytes = bytes.saturating_add(k.len() + v.len() + 2);
        }
        if bytes > MAX_ENV_BYTES {
            return Err(EnvError::TooLarge(bytes));
        }
        Ok(())
    }

    pub fn as_slice(&self) -> &[(String, String)] {
        &self.0
    }

    pub fn into_vec(self) -> Vec<(String, String)> {
        self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(k: &str, v: &str) -> Result<EnvVars, EnvError> {
        EnvVars::new(vec![(k.into(), v.into())])
    }

    #[test]
    fn names_and_values_that_would_change_the_environ_are_refused() {
        assert_eq!(one("", "x"), Err(EnvError::Name(String::new())));
        assert_eq!(one("A=B", "x"), Err(EnvError::Name("A=B".into())));
        assert_eq!(one("A\0", "x"), Err(EnvError::Name("A\0".into())));
        assert_eq!(one("A", "x\0y"), Err(EnvError::Value("A".into())));
        // Anything else is the process's business (shells cannot name `1X`, env(1) can).
        for (k, v) in [("PATH", "/bin"), ("1X", ""), ("é", "ü=ß"), ("A", "")] {
            assert!(one(k, v).is_ok(), "{k:?}={v:?}");
        }
    }

    #[test]
    fn the_total_size_is_bounded_exactly() {
        // "K" + "=" + value + NUL: one byte under, at, and over the limit.
        let at = MAX_ENV_BYTES - 3;
        assert!(one("K", &"v".repeat(at)).is_ok());
        assert_eq!(
            one("K", &"v".repeat(at + 1)),
            Err(EnvError::TooLarge(MAX_ENV_BYTES + 1))
        );
        let many: Vec<(String, String)> = (0..MAX_ENV_BYTES / 8)
            .map(|i| (format!("V{i}"), "x".repeat(8)))
            .collect();
        assert!(matches!(EnvVars::check(&many), Err(EnvError::TooLarge(_))));
    }
}
