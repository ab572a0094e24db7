//! Durations as Istio's API writes them (`"1.5s"`, `"100ms"`, `"1m"`, `"1h"`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::str::FromStr;

/// A non-negative duration with millisecond precision, written like protobuf Durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Duration(std::time::Duration);

/// A duration string that could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: expected a number followed by h, m, s or ms (e.g. \"1.5s\")")]
pub struct DurationError {
    /// The rejected input.
    pub input: String,
}

impl Duration {
    /// The duration as a std Duration.
    pub fn get(self) -> std::time::Duration {
        self.0
    }

    /// Builds from milliseconds.
    pub fn from_millis(ms: u64) -> Duration {
        Duration(std::time::Duration::from_millis(ms))
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || DurationError {
            input: s.to_string(),
        };
        let t = s.trim();
        let (num, unit_ms) = if let Some(n) = t.strip_suffix("ms") {
            (n, 1.0)
        } else if let Some(n) = t.strip_suffix('s') {
            (n, 1_000.0)
        } else if let Some(n) = t.strip_suffix('m') {
            (n, 60_000.0)
        } else if let Some(n) = t.strip_suffix('h') {
            (n, 3_600_000.0)
        } else {
            return Err(err());
        };
        let value: f64 = num.parse().map_err(|_| err())?;
        if !value.is_finite() || value < 0.0 {
            return Err(err());
        }
        let ms = (value * unit_ms).round();
        if ms > u64::MAX as f64 {
            return Err(err());
        }
        Ok(Duration::from_millis(ms as u64))
    }
}

impl std::fmt::Display for Duration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istio_forms() {
        assert_eq!(
            "1.5s".parse::<Duration>().unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            "100ms".parse::<Duration>().unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            "2m".parse::<Duration>().unwrap(),
            Duration::from_millis(120_000)
        );
        assert_eq!(
            "1h".parse::<Duration>().unwrap(),
            Duration::from_millis(3_600_000)
        );
        assert!("5".parse::<Duration>().is_err());
        assert!("-1s".parse::<Duration>().is_err());
        assert!("abcs".parse::<Duration>().is_err());
    }

    #[test]
    fn displays_round_trip() {
        for s in ["3s", "250ms", "0s"] {
            assert_eq!(s.parse::<Duration>().unwrap().to_string(), s);
        }
    }
}
