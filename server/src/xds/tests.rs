//! ADS State-of-the-World protocol tests against a real tonic server.
