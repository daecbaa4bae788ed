//! Firecracker's process outputs, driven through the API: the logger
//! (`PUT /logger`), the metrics (`PUT /metrics`, `FlushMetrics`), and the
//! last snapshot's manifest (`GET /snapshot/last`, since `PUT
//! /snapshot/create` answers 204 with no body, as Firecracker does).

use super::Vmm;
use crate::api::ApiError;
use crate::config::{LoggerConfig, MetricsConfig};
use crate::snapshot::format::Manifest;

/// Firecracker's answer to a pre-boot-only request once the microVM runs.
const NOT_AFTER_START: &str =
    "The requested operation is not supported after starting the microVM.";

impl Vmm {
    /// `PUT /logger`: spore's log lines go to the path from now on.
    pub fn set_logger(&self, c: LoggerConfig) -> Result<(), ApiError> {
        // As Firecracker: the logger is set before start, not after (its
        // answer to the same request once the microVM runs is a 400).
        if self.lock().vm().is_some() {
            return Err(ApiError::BadRequest(NOT_AFTER_START.into()));
        }
        crate::logger::configure(&c, &self.id).map_err(ApiError::BadRequest)?;
        self.lock().config.logger = Some(c);
        Ok(())
    }

    /// `PUT /metrics`: metrics lines go to the path (once per process).
    pub fn set_metrics(&self, c: MetricsConfig) -> Result<(), ApiError> {
        crate::metrics::configure(&c, &self.id).map_err(ApiError::BadRequest)?;
        self.lock().config.metrics = Some(c);
        Ok(())
    }

    /// `PUT /actions` `FlushMetrics`: a metrics line now. Like Firecracker,
    /// only once the microVM is started.
    pub fn flush_metrics(&self) -> Result<(), ApiError> {
        self.lock().built()?;
        crate::metrics::flush();
        Ok(())
    }

    /// Applies a config file's `logger` and `metrics` sections (before the
    /// VM is started from it), as Firecracker does at start-up.
    pub fn configure_outputs(&self) -> Result<(), String> {
        let (logger, metrics) = {
            let inner = self.lock();
            (inner.config.logger.clone(), inner.config.metrics.clone())
        };
        if let Some(c) = logger {
            crate::logger::configure(&c, &self.id)?;
        }
        if let Some(c) = metrics {
            crate::metrics::configure(&c, &self.id)?;
        }
        Ok(())
    }

    /// `GET /snapshot/last`: the manifest of the last snapshot this VMM wrote.
    pub fn last_snapshot(&self) -> Result<Manifest, ApiError> {
        self.lock()
            .last_snapshot
            .clone()
            .ok_or_else(|| ApiError::NotFound("this VMM has not written a snapshot yet".into()))
    }
}
