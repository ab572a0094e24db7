//! The wire envelope: every value on the bus is an rmp-serde encoded [`Envelope`].

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The schema version this build writes and accepts. Bump on incompatible model changes,
/// so older servers reject newer payloads loudly instead of misreading them.
pub const SCHEMA_VERSION: u32 = 1;

/// A value on the bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// Schema version of `body`.
    pub schema: u32,
    /// The fleet of the ingester that wrote this value.
    pub fleet: String,
    /// The writer's epoch (lease generation).
    pub epoch: u64,
    /// When the ingester observed the change, in ms since the Unix epoch.
    pub observed_at_ms: u64,
    /// The normalized object.
    pub body: T,
}

/// A payload that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The payload was written with a schema this build does not understand.
    #[error("payload schema {found} is not supported (this build reads schema {supported})")]
    Schema {
        /// Schema in the payload.
        found: u32,
        /// Schema this build supports.
        supported: u32,
    },
    /// The payload is not valid msgpack for the expected type.
    #[error("payload does not decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// The value could not be encoded.
    #[error("value does not encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

#[derive(Deserialize)]
struct SchemaOnly {
    schema: u32,
}

impl<T: Serialize> Envelope<T> {
    /// Wraps a body, stamped with the current schema and time.
    pub fn new(fleet: impl Into<String>, epoch: u64, observed_at_ms: u64, body: T) -> Self {
        Envelope {
            schema: SCHEMA_VERSION,
            fleet: fleet.into(),
            epoch,
            observed_at_ms,
            body,
        }
    }

    /// Encodes to msgpack (struct fields as maps, so fields can be added compatibly).
    pub fn encode(&self) -> Result<Vec<u8>, EnvelopeError> {
        Ok(rmp_serde::to_vec_named(self)?)
    }
}

impl<T: DeserializeOwned> Envelope<T> {
    /// Decodes, checking the schema version before the body.
    pub fn decode(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let head: SchemaOnly = rmp_serde::from_slice(bytes)?;
        if head.schema != SCHEMA_VERSION {
            return Err(EnvelopeError::Schema {
                found: head.schema,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(rmp_serde::from_slice(bytes)?)
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_schema_check() {
        let e = Envelope::new("f", 3, 42, "body".to_string());
        let bytes = e.encode().unwrap();
        assert_eq!(Envelope::<String>::decode(&bytes).unwrap(), e);
        let mut future = e.clone();
        future.schema = SCHEMA_VERSION + 1;
        let bytes = future.encode().unwrap();
        assert!(matches!(
            Envelope::<String>::decode(&bytes),
            Err(EnvelopeError::Schema { .. })
        ));
        assert!(matches!(
            Envelope::<String>::decode(b"\xc1"),
            Err(EnvelopeError::Decode(_))
        ));
    }
}
