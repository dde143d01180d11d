//! E2B's `network.rules` on the wire: `{"<host>": [{"transform": {"headers": {"<name>":
//! "<value>"}}}, ...]}`, read into husk's [`NetRules`] (checked there) and shown back the same
//! way, placeholders and all.

use husk_core::net_rules::{NetRules, Rule};
use serde_json::{Map, Value};

/// The rules a request's `network.rules` holds (`None`: absent, null or empty).
pub fn parse(v: Option<&Value>) -> Result<Option<NetRules>, String> {
    let hosts = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) if m.is_empty() => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(_) => return Err("network.rules must be an object of host names".into()),
    };
    let mut out = Vec::with_capacity(hosts.len());
    for (host, rules) in hosts {
        let Value::Array(rules) = rules else {
            return Err(format!("network.rules[{host:?}] must be a list of rules"));
        };
        let mut parsed = Vec::with_capacity(rules.len());
        for r in rules {
            parsed.push(rule(host, r)?);
        }
        out.push((host.clone(), parsed));
    }
    NetRules::new(out).map(Some).map_err(|e| e.to_string())
}

fn rule(host: &str, r: &Value) -> Result<Rule, String> {
    let bad = |what: &str| format!("network.rules[{host:?}]: {what}");
    let Value::Object(r) = r else {
        return Err(bad("each rule must be an object"));
    };
    let Some(transform) = only_field(r, "transform", |k| format!("{k:?}")).map_err(|e| bad(&e))?
    else {
        return Ok(Rule::default());
    };
    let Some(headers) =
        only_field(transform, "headers", |k| format!("transform.{k}")).map_err(|e| bad(&e))?
    else {
        return Ok(Rule::default());
    };
    let mut out = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let Value::String(value) = value else {
            return Err(bad(&format!("the value of {name} must be a string")));
        };
        out.push((name.clone(), value.clone()));
    }
    Ok(Rule { headers: out })
}

/// `obj`'s field `key`: an object, or `None` when absent or null. Any other field (named by
/// `label`) is refused, and so is a `key` that is not an object.
fn only_field<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    label: impl Fn(&str) -> String,
) -> Result<Option<&'a Map<String, Value>>, String> {
    if let Some(k) = obj.keys().find(|k| *k != key) {
        return Err(format!(
            "{} is not supported by husk (only {key})",
            label(k)
        ));
    }
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(format!(
            "{} must be an object",
            label(key).trim_matches('"')
        )),
    }
}

/// The rules as E2B shows them in a sandbox's info (an empty object when there are none).
pub fn to_json(rules: &NetRules) -> Value {
    let mut hosts = Map::new();
    for h in &rules.hosts {
        let list = h
            .rules
            .iter()
            .map(|r| {
                let headers: Map<String, Value> = r
                    .headers
                    .iter()
                    .map(|(n, v)| (n.clone(), Value::String(v.clone())))
                    .collect();
                serde_json::json!({"transform": {"headers": headers}})
            })
            .collect();
        hosts.insert(h.host.clone(), Value::Array(list));
    }
    Value::Object(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_read_and_show_back_as_e2b_writes_them() {
        let wire = json!({
            "API.Example.com": [
                {"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.openai}"}}},
                {"transform": {"headers": {"X-Extra": "1"}}},
            ],
            "*.example.org": [{}],
        });
        let rules = parse(Some(&wire)).unwrap().unwrap();
        assert_eq!(rules.secret_names(), vec!["openai".to_string()]);
        assert_eq!(
            to_json(&rules),
            json!({
                "api.example.com": [
                    {"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.openai}"}}},
                    {"transform": {"headers": {"X-Extra": "1"}}},
                ],
                "*.example.org": [{"transform": {"headers": {}}}],
            })
        );
        assert_eq!(parse(None).unwrap(), None);
        assert_eq!(parse(Some(&Value::Null)).unwrap(), None);
        assert_eq!(parse(Some(&json!({}))).unwrap(), None);
    }

    #[test]
    fn malformed_rules_are_refused_with_the_reason() {
        for (wire, want) in [
            (json!([1]), "object of host names"),
            (json!({"a.example": {}}), "list of rules"),
            (json!({"a.example": [1]}), "must be an object"),
            (
                json!({"a.example": [{"match": {}}]}),
                "\"match\" is not supported",
            ),
            (
                json!({"a.example": [{"transform": {"body": "x"}}]}),
                "transform.body is not supported",
            ),
            (
                json!({"a.example": [{"transform": {"headers": {"x": 1}}}]}),
                "must be a string",
            ),
            (json!({"1.2.3.4": []}), "not a host name"),
        ] {
            let e = parse(Some(&wire)).unwrap_err();
            assert!(e.contains(want), "{wire}: {e}");
        }
    }
}
