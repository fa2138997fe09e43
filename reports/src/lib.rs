//! Reports: one serde result model, self-contained HTML with inline SVG charts, JSON, JUnit XML,
//! HdrHistogram logs, and the CI regression gate.
//!
//! Not built yet (issue "Reports (`reports`)"). It exports no functionality yet.
