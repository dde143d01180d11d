//! husk's template builds. A template is built from husk's TOML spec ([`spec`]) or a
//! Dockerfile ([`dockerfile`]), both parsed into one [`plan::BuildPlan`]; its base is a Debian
//! suite (mmdebstrap), an OCI image ([`oci`]) or another template; every step runs in a build
//! sandbox and its result is a layer cached by the hash of everything it depends on; the
//! merged layers become one erofs image registered in the store.
#![forbid(unsafe_code)]

pub mod dockerfile;
pub mod oci;
pub mod plan;
pub mod spec;
