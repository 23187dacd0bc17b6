//! Any bytes as manifest.json: a typed error or a checked manifest, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(manifest) = prep::format::Manifest::parse(std::path::Path::new("manifest.json"), data) {
        // A parsed manifest is internally consistent, and writes back to one
        // that parses to the same value.
        assert!(manifest.consistency_problems().is_empty());
        let again = prep::format::Manifest::parse(std::path::Path::new("manifest.json"), manifest.to_json().as_bytes())
            .expect("a written manifest parses");
        assert_eq!(again, manifest);
    }
});
