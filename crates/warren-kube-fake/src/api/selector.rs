//! Label and field selectors: parsing and matching.

use serde_json::{json, Value};

use super::error::ApiError;
use super::store::Kind;
use super::validation::{label_key_error, label_value_error};

#[derive(Debug)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    GreaterThan(i64),
    LessThan(i64),
}

/// A parsed `labelSelector`: comma-joined requirements, all of which must hold.
#[derive(Debug, Default)]
pub(super) struct LabelSelector(Vec<(String, LabelOp)>);

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Open,
    Close,
    Comma,
    Equals,
    NotEquals,
    Not,
    Greater,
    Less,
}

impl LabelSelector {
    pub(super) fn parse(text: &str) -> Result<Self, ApiError> {
        let error =
            |why: &str| ApiError::bad_request(format!("unable to parse requirement: {why}"));
        let tokens = tokenize(text);
        let mut tokens = tokens.into_iter().peekable();
        let mut requirements = Vec::new();
        let word = |token: Option<Token>, what: &str| match token {
            Some(Token::Word(word)) => Ok(word),
            other => Err(error(&format!("found '{other:?}', expected: {what}"))),
        };
        while tokens.peek().is_some() {
            let requirement = if tokens.peek() == Some(&Token::Not) {
                tokens.next();
                (
                    word(tokens.next(), "identifier after '!'")?,
                    LabelOp::DoesNotExist,
                )
            } else {
                let key = word(tokens.next(), "identifier")?;
                let op = match tokens.peek() {
                    None | Some(Token::Comma) => LabelOp::Exists,
                    Some(Token::Equals | Token::NotEquals) => {
                        let equal = tokens.next() == Some(Token::Equals);
                        let value = match tokens.peek() {
                            Some(Token::Word(_)) => word(tokens.next(), "value")?,
                            _ => String::new(),
                        };
                        if equal {
                            LabelOp::Equals(value)
                        } else {
                            LabelOp::NotEquals(value)
                        }
                    }
                    Some(Token::Greater | Token::Less) => {
                        let greater = tokens.next() == Some(Token::Greater);
                        let value = word(tokens.next(), "integer value")?;
                        let number = value.parse::<i64>().map_err(|_| {
                            error(&format!(
                                "for 'Gt', 'Lt' operators, the value must be an integer: {value}"
                            ))
                        })?;
                        if greater {
                            LabelOp::GreaterThan(number)
                        } else {
                            LabelOp::LessThan(number)
                        }
                    }
                    Some(Token::Word(op)) if op == "in" || op == "notin" => {
                        let is_in = op == "in";
                        tokens.next();
                        if tokens.next() != Some(Token::Open) {
                            return Err(error("expected '(' after set operator"));
                        }
                        let mut values = Vec::new();
                        loop {
                            match tokens.next() {
                                Some(Token::Word(value)) => values.push(value),
                                Some(Token::Comma) => {}
                                Some(Token::Close) => break,
                                other => {
                                    return Err(error(&format!(
                                        "found '{other:?}', expected: ',', ')' or identifier"
                                    )))
                                }
                            }
                        }
                        if values.is_empty() {
                            return Err(error(
                                "for 'in', 'notin' operators, values set can't be empty",
                            ));
                        }
                        if is_in {
                            LabelOp::In(values)
                        } else {
                            LabelOp::NotIn(values)
                        }
                    }
                    Some(other) => {
                        return Err(error(&format!("found '{other:?}', expected an operator")))
                    }
                };
                (key, op)
            };
            if let Some(why) = label_key_error(&requirement.0) {
                return Err(error(&format!(
                    "key: Invalid value: {:?}: {why}",
                    requirement.0
                )));
            }
            let values: Vec<&String> = match &requirement.1 {
                LabelOp::Equals(v) | LabelOp::NotEquals(v) => vec![v],
                LabelOp::In(vs) | LabelOp::NotIn(vs) => vs.iter().collect(),
                _ => Vec::new(),
            };
            for value in values {
                if let Some(why) = label_value_error(value) {
                    return Err(error(&format!(
                        "values[0]: Invalid value: {value:?}: {why}"
                    )));
                }
            }
            requirements.push(requirement);
            match tokens.next() {
                None | Some(Token::Comma) => {}
                Some(other) => return Err(error(&format!("found '{other:?}', expected: ','"))),
            }
        }
        Ok(Self(requirements))
    }

    pub(super) fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.0.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                LabelOp::Equals(expected) => value == Some(expected.as_str()),
                LabelOp::NotEquals(expected) => value != Some(expected.as_str()),
                LabelOp::In(set) => value.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::NotIn(set) => !value.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
                LabelOp::GreaterThan(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                LabelOp::LessThan(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }
}

fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '(' => tokens.push(Token::Open),
            ')' => tokens.push(Token::Close),
            ',' => tokens.push(Token::Comma),
            '>' => tokens.push(Token::Greater),
            '<' => tokens.push(Token::Less),
            '=' => {
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                tokens.push(Token::Equals);
            }
            '!' => {
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::NotEquals);
                } else {
                    tokens.push(Token::Not);
                }
            }
            c => {
                let mut word = String::from(c);
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || "(),=!<>".contains(next) {
                        break;
                    }
                    word.push(next);
                    chars.next();
                }
                tokens.push(Token::Word(word));
            }
        }
    }
    tokens
}

/// A parsed `fieldSelector`: `field=value`, `field==value`, `field!=value`, comma-joined.
#[derive(Debug, Default)]
pub(super) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub(super) fn parse(kind: Kind, text: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((field, value)) = term.split_once("!=") {
                (field, false, value)
            } else if let Some((field, value)) = term.split_once("==") {
                (field, true, value)
            } else if let Some((field, value)) = term.split_once('=') {
                (field, true, value)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if field_value(kind, &json!({}), field).is_none() {
                return Err(ApiError::bad_request(format!(
                    "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"{}",
                    if kind == Kind::Pod {
                        ", \"spec.nodeName\", \"spec.restartPolicy\", \"spec.schedulerName\", \"spec.serviceAccountName\", \"status.phase\", \"status.podIP\", \"status.nominatedNodeName\""
                    } else {
                        ""
                    }
                )));
            }
            terms.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    pub(super) fn matches(&self, kind: Kind, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            (field_value(kind, object, field).as_deref() == Some(value.as_str())) == *equal
        })
    }
}

/// The value of a selectable field (`""` when unset), `None` for an unknown field.
fn field_value(kind: Kind, object: &Value, field: &str) -> Option<String> {
    let pointer = match (kind, field) {
        (_, "metadata.name") => "/metadata/name",
        (_, "metadata.namespace") => "/metadata/namespace",
        (Kind::Pod, "spec.nodeName") => "/spec/nodeName",
        (Kind::Pod, "spec.restartPolicy") => "/spec/restartPolicy",
        (Kind::Pod, "spec.schedulerName") => "/spec/schedulerName",
        (Kind::Pod, "spec.serviceAccountName") => "/spec/serviceAccountName",
        (Kind::Pod, "status.phase") => "/status/phase",
        (Kind::Pod, "status.podIP") => "/status/podIP",
        (Kind::Pod, "status.nominatedNodeName") => "/status/nominatedNodeName",
        _ => return None,
    };
    Some(
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_of_every_form_parse_and_match() {
        let object = json!({"metadata": {"labels": {"app": "web", "tier": "front", "n": "5"}}});
        for (selector, expected) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db,cache)", true),
            ("missing notin (x)", true),
            ("app=web,tier in (front),!missing", true),
            ("app=web,tier=back", false),
            ("n>4,n<6", true),
            ("n>5", false),
        ] {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&object), expected, "{selector}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_bad_requests() {
        for selector in [
            "app in ()",
            "app in web",
            "=x",
            "a b",
            "bad key=x",
            "app=bad value!",
        ] {
            let error = LabelSelector::parse(selector).unwrap_err();
            assert_eq!(error.code, 400, "{selector}");
        }
    }
}
