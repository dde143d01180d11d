//! The proto3-JSON encodings of scalar types, shared by the message types.
//!
//! The SDKs' protobuf runtimes are strict about what they produce and lenient about what they
//! accept, and husk must be the same: integers are accepted as JSON numbers or strings (64-bit
//! ones are always written as strings), enums as names or numbers (always written as names),
//! `bytes` as standard or URL-safe base64 with or without padding (written as standard, padded),
//! timestamps as RFC 3339 (written in UTC with 0, 3, 6 or 9 fractional digits), and `null` as
//! the field's default value.

use std::fmt;
use std::marker::PhantomData;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Integer field types, decoded through a common wide representation and range-checked.
pub trait ProtoInt: Sized + Default + Copy {
    /// The protobuf type name, for error messages.
    const NAME: &'static str;
    fn from_i128(v: i128) -> Option<Self>;
}

macro_rules! proto_int {
    ($($t:ty => $name:literal),*) => {$(
        impl ProtoInt for $t {
            const NAME: &'static str = $name;
            fn from_i128(v: i128) -> Option<Self> {
                <$t>::try_from(v).ok()
            }
        }
    )*};
}

proto_int!(i32 => "int32", u32 => "uint32", i64 => "int64", u64 => "uint64");

/// A wrapper that deserializes a [`ProtoInt`] from a number or a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Int<T>(pub T);

impl<'de, T: ProtoInt> Deserialize<'de> for Int<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IntVisitor(PhantomData)).map(Int)
    }
}

struct IntVisitor<T>(PhantomData<T>);

impl<T: ProtoInt> IntVisitor<T> {
    fn checked<E: de::Error>(v: i128) -> Result<T, E> {
        T::from_i128(v).ok_or_else(|| E::custom(format!("{v} is out of range for {}", T::NAME)))
    }

    /// Floats are accepted when integral (proto3 JSON allows `1e3` and `5.0`).
    fn from_f64<E: de::Error>(v: f64) -> Result<T, E> {
        // 2^100 is far beyond every target type; the bound keeps the cast exact and in range.
        if v.is_finite() && v.fract() == 0.0 && v.abs() < 1.0e30 {
            Self::checked(v as i128)
        } else {
            Err(E::custom(format!("{v} is not an integer for {}", T::NAME)))
        }
    }
}

impl<T: ProtoInt> Visitor<'_> for IntVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an {} as a JSON number or string", T::NAME)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        Self::checked(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Self::checked(i128::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        Self::from_f64(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        if let Ok(n) = v.parse::<i128>() {
            return Self::checked(n);
        }
        // Only numeric spellings fall through to float parsing ("inf" and "NaN" are refused).
        let numeric = !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'));
        match v.parse::<f64>() {
            Ok(f) if numeric => Self::from_f64(f),
            _ => Err(E::custom(format!("{v:?} is not a valid {}", T::NAME))),
        }
    }
}

/// `deserialize_with` for integer fields: number, string, or `null` (the default, 0).
pub fn int<'de, D: Deserializer<'de>, T: ProtoInt>(d: D) -> Result<T, D::Error> {
    Ok(Option::<Int<T>>::deserialize(d)?
        .map(|i| i.0)
        .unwrap_or_default())
}

/// `serialize_with` for 64-bit integers, which proto3 JSON writes as strings.
pub fn int64_string<S: Serializer, T: fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// `deserialize_with` for fields whose `null` means the default (strings, lists, maps, bools).
pub fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

pub fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

pub fn is_false(v: &bool) -> bool {
    !*v
}

/// A `bytes` value, written as standard padded base64.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Base64(pub Vec<u8>);

impl Serialize for Base64 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Base64Ref(&self.0).serialize(s)
    }
}

/// A borrowed `bytes` value, for writing without copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Base64Ref<'a>(pub &'a [u8]);

impl Serialize for Base64Ref<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(self.0))
    }
}

impl<'de> Deserialize<'de> for Base64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        decode_base64(&text).map(Base64).map_err(de::Error::custom)
    }
}

/// Decodes base64 in any of the four alphabets/padding combinations proto3 JSON allows.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    let url_safe = text.contains(['-', '_']);
    let padded = text.ends_with('=');
    let engine = match (url_safe, padded) {
        (false, true) => &STANDARD,
        (false, false) => &STANDARD_NO_PAD,
        (true, true) => &URL_SAFE,
        (true, false) => &URL_SAFE_NO_PAD,
    };
    engine
        .decode(text)
        .map_err(|err| format!("invalid base64: {err}"))
}

/// A `google.protobuf.Timestamp`: seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: u32,
}

/// The range proto3 JSON can express: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

impl Timestamp {
    /// A timestamp, or `None` when it is outside what RFC 3339 can express (years 1 to 9999)
    /// or `nanos` is not below one second.
    pub fn new(seconds: i64, nanos: u32) -> Option<Timestamp> {
        ((MIN_SECONDS..=MAX_SECONDS).contains(&seconds) && nanos < 1_000_000_000)
            .then_some(Timestamp { seconds, nanos })
    }

    /// RFC 3339 in UTC, with 0, 3, 6 or 9 fractional digits as protobuf runtimes write it.
    pub fn to_rfc3339(self) -> Option<String> {
        let t = OffsetDateTime::from_unix_timestamp(self.seconds).ok()?;
        let frac = match self.nanos {
            0 => String::new(),
            n if n % 1_000_000 == 0 => format!(".{:03}", n / 1_000_000),
            n if n % 1_000 == 0 => format!(".{:06}", n / 1_000),
            n => format!(".{n:09}"),
        };
        Some(format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{frac}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ))
    }

    /// Parses RFC 3339 with any offset and up to nanosecond precision.
    pub fn parse(text: &str) -> Result<Timestamp, String> {
        let t = OffsetDateTime::parse(text, &Rfc3339)
            .map_err(|err| format!("invalid timestamp {text:?}: {err}"))?;
        Timestamp::new(t.unix_timestamp(), t.nanosecond())
            .ok_or_else(|| format!("timestamp {text:?} is out of range"))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.to_rfc3339() {
            Some(text) => s.serialize_str(&text),
            None => Err(serde::ser::Error::custom("timestamp out of range")),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Timestamp::parse(&text).map_err(de::Error::custom)
    }
}

/// The member of a oneof that is set: `None` when none is, an error when several are (proto3
/// JSON parsers refuse that too).
pub fn oneof<T>(
    what: &str,
    members: impl IntoIterator<Item = Option<T>>,
) -> Result<Option<T>, String> {
    let mut set = members.into_iter().flatten();
    let first = set.next();
    if set.next().is_some() {
        return Err(format!("several members of oneof {what} are set"));
    }
    Ok(first)
}

/// Defines a proto3 enum: written as its full name, read from its name or number (`null` is
/// the zero value). Unknown names and numbers are refused, so a request cannot smuggle in a
/// value the conversions below would have to guess about.
macro_rules! proto_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($proto:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $num:literal => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        $vis enum $name {
            #[default]
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            pub const PROTO_NAME: &'static str = $proto;

            pub fn name(self) -> &'static str {
                match self { $( $name::$variant => $text, )+ }
            }

            pub fn number(self) -> i32 {
                match self { $( $name::$variant => $num, )+ }
            }

            pub fn from_name(name: &str) -> Option<Self> {
                match name { $( $text => Some($name::$variant), )+ _ => None }
            }

            pub fn from_number(number: i64) -> Option<Self> {
                match number { $( $num => Some($name::$variant), )+ _ => None }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                use serde::de::Error;
                match Option::<serde_json::Value>::deserialize(d)? {
                    None => Ok($name::default()),
                    Some(serde_json::Value::String(s)) => $name::from_name(&s).ok_or_else(|| {
                        D::Error::custom(format!("unknown {} value {s:?}", $proto))
                    }),
                    Some(serde_json::Value::Number(n)) => n
                        .as_i64()
                        .and_then($name::from_number)
                        .ok_or_else(|| D::Error::custom(format!("unknown {} value {n}", $proto))),
                    Some(other) => Err(D::Error::custom(format!(
                        "expected a {} name or number, got {other}",
                        $proto
                    ))),
                }
            }
        }
    };
}

pub(crate) use proto_enum;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Ints {
        #[serde(default, deserialize_with = "int")]
        a: i64,
        #[serde(default, deserialize_with = "int")]
        b: u32,
        #[serde(default, deserialize_with = "int")]
        c: i32,
    }

    fn ints(v: serde_json::Value) -> Result<Ints, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn integers_from_numbers_strings_and_null() {
        let got = ints(json!({"a": "9007199254740993", "b": 7, "c": "-3"})).unwrap();
        assert_eq!(
            got,
            Ints {
                a: 9_007_199_254_740_993,
                b: 7,
                c: -3
            }
        );
        let got = ints(json!({"a": 11, "b": "4294967295", "c": null})).unwrap();
        assert_eq!(
            got,
            Ints {
                a: 11,
                b: u32::MAX,
                c: 0
            }
        );
        let got = ints(json!({"a": 1e3, "b": "5.0", "c": "1e2"})).unwrap();
        assert_eq!(
            got,
            Ints {
                a: 1000,
                b: 5,
                c: 100
            }
        );
        assert_eq!(ints(json!({})).unwrap(), Ints { a: 0, b: 0, c: 0 });
    }

    #[test]
    fn integers_refuse_garbage_and_overflow() {
        for bad in [
            json!({"b": -1}),
            json!({"b": "4294967296"}),
            json!({"c": 2147483648u64}),
            json!({"a": "9223372036854775808"}),
            json!({"a": 1.5}),
            json!({"a": "1.5"}),
            json!({"a": "abc"}),
            json!({"a": ""}),
            json!({"a": "inf"}),
            json!({"a": "NaN"}),
            json!({"a": true}),
            json!({"a": [1]}),
            json!({"a": 1e300}),
        ] {
            assert!(ints(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn base64_alphabets() {
        let b: Base64 = serde_json::from_value(json!("aGk=")).unwrap();
        assert_eq!(b.0, b"hi");
        let b: Base64 = serde_json::from_value(json!("aGk")).unwrap();
        assert_eq!(b.0, b"hi");
        let b: Base64 = serde_json::from_value(json!("-_8=")).unwrap();
        assert_eq!(b.0, [0xfb, 0xff]);
        let b: Base64 = serde_json::from_value(json!("+/8")).unwrap();
        assert_eq!(b.0, [0xfb, 0xff]);
        let b: Base64 = serde_json::from_value(json!(null)).unwrap();
        assert!(b.0.is_empty());
        for bad in ["a", "a!==", "aGk==", "****", "+_8="] {
            assert!(
                serde_json::from_value::<Base64>(json!(bad)).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            serde_json::to_value(Base64(vec![0xfb, 0xff])).unwrap(),
            json!("+/8=")
        );
    }

    #[test]
    fn timestamps() {
        let t = Timestamp::new(1_796_040_000, 123_456_789).unwrap();
        assert_eq!(t.to_rfc3339().unwrap(), "2026-11-30T12:00:00.123456789Z");
        assert_eq!(
            Timestamp::parse("2026-11-30T12:00:00.123456789Z").unwrap(),
            t
        );
        let t = Timestamp::new(1_796_040_000, 0).unwrap();
        assert_eq!(t.to_rfc3339().unwrap(), "2026-11-30T12:00:00Z");
        let t = Timestamp::new(1_796_040_000, 120_000_000).unwrap();
        assert_eq!(t.to_rfc3339().unwrap(), "2026-11-30T12:00:00.120Z");
        let t = Timestamp::new(1_796_040_000, 123_456_000).unwrap();
        assert_eq!(t.to_rfc3339().unwrap(), "2026-11-30T12:00:00.123456Z");
        assert_eq!(
            Timestamp::new(0, 0).unwrap().to_rfc3339().unwrap(),
            "1970-01-01T00:00:00Z"
        );
        let before = Timestamp::new(-1, 500_000_000).unwrap();
        assert_eq!(before.to_rfc3339().unwrap(), "1969-12-31T23:59:59.500Z");
        // Offsets are normalised to UTC.
        let t = Timestamp::parse("2026-11-30T14:00:00+02:00").unwrap();
        assert_eq!(t, Timestamp::new(1_796_040_000, 0).unwrap());
        assert_eq!(Timestamp::new(MAX_SECONDS + 1, 0), None);
        assert_eq!(Timestamp::new(MIN_SECONDS - 1, 0), None);
        assert_eq!(Timestamp::new(0, 1_000_000_000), None);
        assert_eq!(
            Timestamp::new(MAX_SECONDS, 999_999_999)
                .unwrap()
                .to_rfc3339()
                .unwrap(),
            "9999-12-31T23:59:59.999999999Z"
        );
        assert_eq!(
            Timestamp::new(MIN_SECONDS, 0)
                .unwrap()
                .to_rfc3339()
                .unwrap(),
            "0001-01-01T00:00:00Z"
        );
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-11-30 12:00:00",
        ] {
            assert!(Timestamp::parse(bad).is_err(), "{bad}");
        }
    }

    proto_enum! {
        enum Color ("test.Color") {
            Unspecified = 0 => "COLOR_UNSPECIFIED",
            Red = 5 => "COLOR_RED",
        }
    }

    #[test]
    fn enums_by_name_or_number() {
        assert_eq!(
            serde_json::to_value(Color::Red).unwrap(),
            json!("COLOR_RED")
        );
        assert_eq!(
            serde_json::from_value::<Color>(json!("COLOR_RED")).unwrap(),
            Color::Red
        );
        assert_eq!(
            serde_json::from_value::<Color>(json!(5)).unwrap(),
            Color::Red
        );
        assert_eq!(
            serde_json::from_value::<Color>(json!(null)).unwrap(),
            Color::Unspecified
        );
        assert_eq!(
            serde_json::from_value::<Color>(json!(0)).unwrap(),
            Color::Unspecified
        );
        for bad in [
            json!("RED"),
            json!("color_red"),
            json!(4),
            json!(-1),
            json!(5.5),
            json!(true),
        ] {
            assert!(
                serde_json::from_value::<Color>(bad.clone()).is_err(),
                "{bad}"
            );
        }
        assert_eq!(Color::Red.number(), 5);
        assert_eq!(Color::PROTO_NAME, "test.Color");
    }
}
