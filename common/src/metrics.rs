//! Prometheus helpers shared by the binaries.

use prometheus::{core::Collector, Encoder, Registry, TextEncoder};

/// Registers every collector; a name registered twice is a programming error.
pub fn register_all(registry: &Registry, collectors: Vec<Box<dyn Collector>>) {
    for c in collectors {
        registry.register(c).expect("metric registered once");
    }
}

/// The Prometheus text exposition of a registry.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec cannot fail for well-formed metrics.
    let _ = TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_metrics() {
        let registry = Registry::new();
        let c = prometheus::IntCounter::new("shoal_test_total", "A test counter.").unwrap();
        register_all(&registry, vec![Box::new(c.clone())]);
        c.inc();
        assert!(render(&registry).contains("shoal_test_total 1"));
    }
}
