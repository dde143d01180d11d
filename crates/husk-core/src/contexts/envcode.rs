//! Per-call environment variables, as code in the kernel's own language: set before the
//! call's code and restored after it (E2B's `run_code(envs=...)`). The kernel process's own
//! environment (the sandbox's variables and secrets) is set when it starts; this changes the
//! interpreter's view (`os.environ`, `process.env`, the shell's exports) for one call.
//!
//! Names and values are data from the client, so they are only ever embedded as string
//! literals escaped for the language, never as code.

/// The set-up and restore code of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvCode {
    pub set: String,
    pub restore: String,
}

/// A JSON string literal, which is also a valid Python and JavaScript string literal
/// (serde_json escapes quotes, backslashes and control characters, nothing else).
fn lit(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// A single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn valid_shell_name(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The code for `language` (normalised), or `None` when husk has none for it.
pub fn for_language(language: &str, vars: &[(String, String)]) -> Option<EnvCode> {
    match language {
        "python" => {
            let pairs: Vec<String> = vars
                .iter()
                .map(|(k, v)| format!("{}: {}", lit(k), lit(v)))
                .collect();
            let dict = format!("{{{}}}", pairs.join(", "));
            Some(EnvCode {
                set: format!(
                    "import os as __husk_os\n\
                     __husk_env = {dict}\n\
                     __husk_env_saved = {{k: __husk_os.environ.get(k) for k in __husk_env}}\n\
                     __husk_os.environ.update(__husk_env)\n\
                     del __husk_env"
                ),
                restore: "for __husk_k, __husk_v in __husk_env_saved.items():\n    \
                          if __husk_v is None:\n        \
                          __husk_os.environ.pop(__husk_k, None)\n    \
                          else:\n        \
                          __husk_os.environ[__husk_k] = __husk_v\n\
                          del __husk_env_saved, __husk_os\n\
                          try:\n    del __husk_k, __husk_v\nexcept NameError:\n    pass"
                    .into(),
            })
        }
        "javascript" => {
            let pairs: Vec<String> = vars
                .iter()
                .map(|(k, v)| format!("[{}, {}]", lit(k), lit(v)))
                .collect();
            Some(EnvCode {
                set: format!(
                    "globalThis.__husk_env_saved = [{}].map(([k, v]) => {{ \
                     const old = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined; \
                     process.env[k] = v; return [k, old]; }});",
                    pairs.join(", ")
                ),
                restore: "for (const [k, old] of globalThis.__husk_env_saved) { \
                          if (old === undefined) delete process.env[k]; else process.env[k] = old; } \
                          delete globalThis.__husk_env_saved;"
                    .into(),
            })
        }
        "bash" => {
            // Names a shell cannot export are refused rather than mangled.
            if !vars.iter().all(|(k, _)| valid_shell_name(k)) {
                return None;
            }
            let mut set = String::from("__husk_env_saved=\"$(export -p)\"\n");
            let mut unset = String::from("unset");
            for (k, v) in vars {
                set.push_str(&format!("export {k}={}\n", sh_quote(v)));
                unset.push(' ');
                unset.push_str(k);
            }
            Some(EnvCode {
                set,
                restore: format!("{unset}\neval \"$__husk_env_saved\"\nunset __husk_env_saved"),
            })
        }
        "r" => {
            let names: Vec<String> = vars.iter().map(|(k, _)| lit(k)).collect();
            let sets: Vec<String> = vars
                .iter()
                .map(|(k, v)| format!("{} = {}", sh_quote_r(k), lit(v)))
                .collect();
            Some(EnvCode {
                set: format!(
                    ".husk_env_saved <- Sys.getenv(c({}), unset = NA, names = TRUE)\nSys.setenv({})",
                    names.join(", "),
                    sets.join(", ")
                ),
                restore: "for (.husk_k in names(.husk_env_saved)) { \
                          if (is.na(.husk_env_saved[[.husk_k]])) Sys.unsetenv(.husk_k) \
                          else do.call(Sys.setenv, setNames(list(.husk_env_saved[[.husk_k]]), .husk_k)) }\n\
                          rm(.husk_env_saved, .husk_k)"
                    .into(),
            })
        }
        "java" => {
            // System.getenv's map is unmodifiable; husk's Java kernel opens java.util to the
            // cells, so the map inside it is reached and changed (System.getenv(name) reads
            // it). JSON string literals are Java string literals too.
            let pairs: Vec<String> = vars
                .iter()
                .map(|(k, v)| format!("{{{}, {}}}", lit(k), lit(v)))
                .collect();
            Some(EnvCode {
                set: format!(
                    "var __husk_env_map = ((java.util.function.Supplier<java.util.Map<String, String>>) () -> {{ \
                     try {{ var e = System.getenv(); var f = e.getClass().getDeclaredField(\"m\"); \
                     f.setAccessible(true); @SuppressWarnings(\"unchecked\") var m = (java.util.Map<String, String>) f.get(e); return m; }} \
                     catch (ReflectiveOperationException | RuntimeException x) {{ \
                     throw new IllegalStateException(\"husk: this kernel cannot set environment variables: \" + x, x); }} }}).get();\n\
                     var __husk_env_saved = new java.util.HashMap<String, String>();\n\
                     for (String[] __husk_kv : new String[][] {{{}}}) {{ \
                     __husk_env_saved.put(__husk_kv[0], __husk_env_map.get(__husk_kv[0])); \
                     __husk_env_map.put(__husk_kv[0], __husk_kv[1]); }}",
                    pairs.join(", ")
                ),
                restore: "for (var __husk_e : __husk_env_saved.entrySet()) { \
                          if (__husk_e.getValue() == null) __husk_env_map.remove(__husk_e.getKey()); \
                          else __husk_env_map.put(__husk_e.getKey(), __husk_e.getValue()); }\n\
                          __husk_env_saved = null;\n__husk_env_map = null;"
                    .into(),
            })
        }
        _ => None,
    }
}

/// Code that sets `vars` in a running kernel for good and leaves nothing else behind in its
/// namespace (no helper variable): what makes a warm sandbox's kernel, started before anyone
/// claimed it, hold the claimer's environment as one started for it would. `None` for a
/// language husk has no such code for (a warm sandbox then cannot serve a create with
/// variables).
pub fn assign(language: &str, vars: &[(String, String)]) -> Option<String> {
    match language {
        // `os` is imported already (by the kernel itself), so the import adds no module; the
        // name is deleted at once. Later pairs win, as in a process's environment.
        "python" => {
            let pairs: Vec<String> = vars
                .iter()
                .map(|(k, v)| format!("({}, {})", lit(k), lit(v)))
                .collect();
            Some(format!(
                "import os as __husk_os\n\
                 for __husk_kv in [{}]:\n    __husk_os.environ[__husk_kv[0]] = __husk_kv[1]\n\
                 del __husk_os\n\
                 try:\n    del __husk_kv\nexcept NameError:\n    pass",
                pairs.join(", ")
            ))
        }
        // Block-scoped: no global is made.
        "javascript" => {
            let pairs: Vec<String> = vars
                .iter()
                .map(|(k, v)| format!("[{}, {}]", lit(k), lit(v)))
                .collect();
            Some(format!(
                "{{ for (const [k, v] of [{}]) {{ process.env[k] = v; }} }}",
                pairs.join(", ")
            ))
        }
        "bash" => {
            if !vars.iter().all(|(k, _)| valid_shell_name(k)) {
                return None;
            }
            Some(
                vars.iter()
                    .map(|(k, v)| format!("export {k}={}\n", sh_quote(v)))
                    .collect(),
            )
        }
        "r" => {
            let sets: Vec<String> = vars
                .iter()
                .map(|(k, v)| format!("{} = {}", sh_quote_r(k), lit(v)))
                .collect();
            Some(format!("invisible(Sys.setenv({}))", sets.join(", ")))
        }
        _ => None,
    }
}

/// An R argument name in backquotes (any name, escaped).
fn sh_quote_r(k: &str) -> String {
    format!("`{}`", k.replace('\\', r"\\").replace('`', r"\`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_code_embeds_names_and_values_as_literals_only() {
        let vars = [("A\"B".to_string(), "x'\n$y".to_string())];
        let py = assign("python", &vars).unwrap();
        assert!(py.contains(r#"("A\"B", "x'\n$y")"#), "{py}");
        assert!(py.contains("del __husk_os"), "{py}");
        let js = assign("javascript", &vars).unwrap();
        assert!(
            js.starts_with("{ for (const [k, v] of [[\"A\\\"B\""),
            "{js}"
        );
        // A shell cannot export that name: no code rather than a mangled name.
        assert_eq!(assign("bash", &vars), None);
        let sh = assign("bash", &[("K".into(), "it's $HOME".into())]).unwrap();
        assert_eq!(sh, "export K='it'\\''s $HOME'\n");
        let r = assign("r", &[("K".into(), "v".into())]).unwrap();
        assert_eq!(r, "invisible(Sys.setenv(`K` = \"v\"))");
        assert_eq!(assign("java", &vars), None);
    }

    #[test]
    fn java_literals_are_escaped_and_the_map_is_restored() {
        let c = for_language(
            "java",
            &[("A\"B".into(), "x\n\\\"y".into()), ("Z".into(), "é".into())],
        )
        .unwrap();
        assert!(
            c.set
                .contains(r#"new String[][] {{"A\"B", "x\n\\\"y"}, {"Z", "é"}}"#),
            "{}",
            c.set
        );
        assert!(c.restore.contains("__husk_env_map.remove"), "{}", c.restore);
        if let Ok(dir) = std::env::var("HUSK_PRINT_ENVCODE") {
            std::fs::write(format!("{dir}/set.java"), &c.set).unwrap();
            std::fs::write(format!("{dir}/restore.java"), &c.restore).unwrap();
        }
    }

    #[test]
    fn python_literals_are_escaped() {
        let c = for_language(
            "python",
            &[
                ("A\"B".into(), "x'\n\\\"y".into()),
                ("Z".into(), "é".into()),
            ],
        )
        .unwrap();
        assert!(
            c.set.contains(r#"{"A\"B": "x'\n\\\"y", "Z": "é"}"#),
            "{}",
            c.set
        );
        assert!(c.restore.contains("__husk_env_saved"));
    }

    #[test]
    fn bash_quotes_values_and_refuses_odd_names() {
        let c = for_language("bash", &[("K".into(), "it's $(rm -rf /)".into())]).unwrap();
        assert!(
            c.set.contains(r"export K='it'\''s $(rm -rf /)'"),
            "{}",
            c.set
        );
        assert!(c.restore.starts_with("unset K\n"));
        assert_eq!(for_language("bash", &[("A-B".into(), "v".into())]), None);
        assert_eq!(for_language("bash", &[("1A".into(), "v".into())]), None);
    }

    #[test]
    fn unknown_languages_have_none() {
        assert_eq!(for_language("cobol", &[("A".into(), "b".into())]), None);
        assert!(for_language("javascript", &[("A".into(), "b".into())]).is_some());
        assert!(for_language("r", &[("A".into(), "b".into())]).is_some());
    }

    #[test]
    fn r_saves_by_name_even_for_one_variable() {
        // Sys.getenv of one name returns an unnamed value unless asked for names, and the
        // restore loops over the names: without them a call's variable would stay set.
        let c = for_language("r", &[("FOO".into(), "b".into())]).unwrap();
        assert!(c.set.contains("names = TRUE"), "{}", c.set);
        assert!(c.restore.contains("Sys.unsetenv"), "{}", c.restore);
    }
}
