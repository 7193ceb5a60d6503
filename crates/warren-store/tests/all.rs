//! The integration tests of warren-store, in one binary so they share one build and one
//! link step.
//!
//! `suite` holds the behaviour every [`warren_store::StateStore`] must have, instantiated
//! once per backend, plus the checks only the SQLite store can answer (file mode, schema
//! versions).

mod suite;
