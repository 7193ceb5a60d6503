//! Deserialisers that read request bodies exactly as the OpenAPI document describes them.
//!
//! serde reads a struct from a JSON array field by field, and refuses `3.0` for an
//! integer. JSON Schema, which the document is written in, says the opposite of both: an
//! array is not an object, and `3.0` *is* the integer 3. These helpers make the server
//! agree with the document: nested objects must be objects, and whole numbers are accepted
//! in any notation.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

/// A nested object field (`Option<T>` where `T` is a struct): `null`, absent (with
/// `#[serde(default)]`) or a JSON object, never an array.
pub fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::Null => Ok(None),
        value @ serde_json::Value::Object(_) => serde_json::from_value(value)
            .map(Some)
            .map_err(D::Error::custom),
        other => Err(D::Error::custom(format!(
            "expected a JSON object, found {}",
            kind(&other)
        ))),
    }
}

/// An optional whole number: `3` and `3.0` alike; `3.5`, negatives and strings refused.
pub fn whole_number<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: Deserializer<'de>,
{
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Number(number) => number_to_u64(&number).map(Some).ok_or_else(|| {
            D::Error::custom(format!("expected a whole number ≥ 0, found {number}"))
        }),
        other => Err(D::Error::custom(format!(
            "expected a whole number, found {}",
            kind(&other)
        ))),
    }
}

/// A whole number that may be cleared: absent (with `#[serde(default)]`) is `None`,
/// `null` is `Some(None)`, a number is `Some(Some(n))` as [`whole_number`] reads it.
pub fn nullable_whole_number<'de, D>(deserializer: D) -> Result<Option<Option<u64>>, D::Error>
where
    D: Deserializer<'de>,
{
    whole_number(deserializer).map(Some)
}

/// A list of TCP ports: each a whole number from 1 to 65535, `443.0` read as `443` (JSON
/// Schema's integers include whole floats).
pub fn ports<'de, D>(deserializer: D) -> Result<Vec<u16>, D::Error>
where
    D: Deserializer<'de>,
{
    let values = Vec::<serde_json::Value>::deserialize(deserializer)?;
    values
        .iter()
        .map(|value| match value {
            serde_json::Value::Number(number) => number_to_u64(number)
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n != 0)
                .ok_or_else(|| {
                    D::Error::custom(format!("expected a port 1 to 65535, found {number}"))
                }),
            other => Err(D::Error::custom(format!(
                "expected a port, found {}",
                kind(other)
            ))),
        })
        .collect()
}

/// A required whole number, as [`whole_number`].
pub fn required_whole_number<'de, D>(deserializer: D) -> Result<u64, D::Error>
where
    D: Deserializer<'de>,
{
    whole_number(deserializer)?
        .ok_or_else(|| D::Error::custom("expected a whole number, found null"))
}

/// A required whole number below 65536 (a terminal's side), as [`whole_number`].
pub fn required_u16<'de, D>(deserializer: D) -> Result<u16, D::Error>
where
    D: Deserializer<'de>,
{
    let number = required_whole_number(deserializer)?;
    u16::try_from(number)
        .map_err(|_| D::Error::custom(format!("expected a number below 65536, found {number}")))
}

/// An optional whole number for a count (`usize`), as [`whole_number`].
pub fn whole_count<'de, D>(deserializer: D) -> Result<Option<usize>, D::Error>
where
    D: Deserializer<'de>,
{
    whole_number(deserializer)?
        .map(|n| usize::try_from(n).map_err(|_| D::Error::custom("the number is too large")))
        .transpose()
}

fn number_to_u64(number: &serde_json::Number) -> Option<u64> {
    if let Some(n) = number.as_u64() {
        return Some(n);
    }
    let float = number.as_f64()?;
    // Exactly representable whole numbers only: 2^53 and beyond are not exact in f64.
    (float >= 0.0 && float.fract() == 0.0 && float < 9_007_199_254_740_992.0)
        .then_some(float as u64)
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(default, deserialize_with = "super::object")]
        inner: Option<Inner>,
        #[serde(default, deserialize_with = "super::whole_number")]
        n: Option<u64>,
    }

    fn parse(text: &str) -> Result<Outer, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_nested_object_given_as_an_array_is_refused() {
        assert_eq!(
            parse(r#"{"inner": {"a": 1}}"#).unwrap().inner,
            Some(Inner { a: 1 })
        );
        assert_eq!(parse(r#"{"inner": null}"#).unwrap().inner, None);
        assert_eq!(parse("{}").unwrap().inner, None);
        let error = parse(r#"{"inner": [1]}"#).unwrap_err();
        assert!(error.contains("expected a JSON object"), "{error}");
    }

    #[test]
    fn whole_numbers_are_accepted_in_any_notation_and_fractions_are_not() {
        assert_eq!(parse(r#"{"n": 3}"#).unwrap().n, Some(3));
        assert_eq!(parse(r#"{"n": 3.0}"#).unwrap().n, Some(3));
        assert_eq!(parse(r#"{"n": 3e2}"#).unwrap().n, Some(300));
        assert_eq!(parse(r#"{"n": null}"#).unwrap().n, None);
        // Read exactly, not to the nearest float but one (serde_json's `float_roundtrip`):
        // schemathesis sends such numbers, and 4362774997645054.0 must not become .5.
        assert_eq!(
            parse(r#"{"n": 4362774997645054.0}"#).unwrap().n,
            Some(4_362_774_997_645_054)
        );
        for refused in [
            r#"{"n": 3.5}"#,
            r#"{"n": -1}"#,
            r#"{"n": "3"}"#,
            r#"{"n": 1e300}"#,
        ] {
            assert!(parse(refused).is_err(), "{refused}");
        }
    }
}
