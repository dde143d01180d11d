//! A template build's request as the API takes it (`POST /husk/v1/templates?name=...`): its
//! query, checked by the server and again by the build helper (for which it is hostile), and
//! the spec it names in the uploaded context.

use std::path::{Component, Path, PathBuf};

use husk_core::template::HOST_TEMPLATE;

use crate::context::ContextDir;
use crate::plan::BuildPlan;

/// A build request's query, checked (by the server, and again by the build helper).
pub struct BuildQuery {
    pub name: String,
    /// The spec inside the archive, relative; `None`: look for the usual names at its top.
    pub file: Option<PathBuf>,
    pub no_cache: bool,
    pub build_args: Vec<(String, String)>,
}

/// Checks a build's query; the message is a 400's.
pub fn parse_query(q: &[(String, String)]) -> Result<BuildQuery, String> {
    let mut out = BuildQuery {
        name: String::new(),
        file: None,
        no_cache: false,
        build_args: Vec::new(),
    };
    for (k, v) in q {
        match k.as_str() {
            "name" => out.name = v.clone(),
            "file" => {
                let p = Path::new(v);
                let plain =
                    !v.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
                if !plain {
                    return Err(format!(
                        "file must be a relative path inside the archive without '..' (got {v:?})"
                    ));
                }
                out.file = Some(p.to_path_buf());
            }
            "no_cache" => {
                out.no_cache = match v.as_str() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    _ => return Err(format!("no_cache must be true or false (got {v:?})")),
                }
            }
            "build_arg" => match v.split_once('=') {
                Some((k, v)) if !k.is_empty() => out.build_args.push((k.into(), v.into())),
                _ => return Err(format!("invalid build_arg {v:?}: expected KEY=VALUE")),
            },
            other => return Err(format!("unknown query parameter '{other}'")),
        }
    }
    if out.name.is_empty() {
        return Err("name is required: POST /husk/v1/templates?name=NAME".into());
    }
    if !crate::spec::valid_template_name(&out.name) {
        return Err(format!(
            "invalid template name {:?}: use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
            out.name
        ));
    }
    if out.name == HOST_TEMPLATE {
        return Err("the name `host` is reserved for the host template".into());
    }
    Ok(out)
}

/// The plan of the spec in `ctx` and its path in the archive: at `file`, else the first of
/// `husk.toml`, `e2b.Dockerfile` and `Dockerfile` at the archive's top. The message is a
/// 400's.
pub fn load(
    ctx: &ContextDir,
    file: Option<&Path>,
    build_args: &[(String, String)],
) -> Result<(BuildPlan, PathBuf), String> {
    let rel = match file {
        Some(f) => f.to_path_buf(),
        None => ["husk.toml", "e2b.Dockerfile", "Dockerfile"]
            .iter()
            .map(PathBuf::from)
            .find(|n| ctx.path().join(n).is_file())
            .ok_or_else(|| {
                "the archive has no husk.toml, e2b.Dockerfile or Dockerfile at its top (name the spec with file=PATH)".to_string()
            })?,
    };
    let path = ctx.path().join(&rel);
    if !path.is_file() {
        return Err(format!("the archive has no file {}", rel.display()));
    }
    let plan = crate::spec::load(&path, build_args).map_err(|e| e.to_string())?;
    Ok((plan, rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_checked() {
        let q = |s: &[(&str, &str)]| {
            parse_query(
                &s.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        let ok = q(&[
            ("name", "py"),
            ("file", "sub/Dockerfile"),
            ("build_arg", "A=1=2"),
            ("no_cache", "true"),
        ])
        .ok()
        .unwrap();
        assert_eq!(ok.build_args, vec![("A".into(), "1=2".into())]);
        assert!(ok.no_cache);
        for bad in [
            &[("file", "x")][..],
            &[("name", "host")],
            &[("name", "Bad")],
            &[("name", "a"), ("file", "../x")],
            &[("name", "a"), ("file", "/x")],
            &[("name", "a"), ("build_arg", "=x")],
            &[("name", "a"), ("no_cache", "maybe")],
            &[("name", "a"), ("nme", "b")],
        ] {
            assert!(q(bad).is_err(), "{bad:?}");
        }
    }
}
