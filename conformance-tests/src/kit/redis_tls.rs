//! A `redis-server` that also speaks TLS: the kit generates a CA and a server certificate
//! ([`TlsFiles`]) and starts a [`Redis`] with `--tls-port` next to its plain port (which the kit
//! uses for readiness and admin commands such as `ACL SETUSER`).

use std::path::PathBuf;

use super::error::KitResult;
use super::free_port;
use super::redis::Redis;
use super::tls::TlsFiles;

/// A private `redis-server` with a plain port and a TLS port (clients need no certificate, but
/// the password of [`Redis`]).
#[derive(Debug)]
pub struct RedisTls {
    redis: Redis,
    tls_port: u16,
    files: TlsFiles,
}

impl RedisTls {
    /// Generates certificates and starts the server without persistence.
    ///
    /// # Cancel safety
    /// Dropping the future kills the server if it was started and removes the certificates.
    ///
    /// # Errors
    /// `openssl` or `redis-server` missing or failing (a `redis-server` built without TLS
    /// exits at once, and the error shows its log).
    pub async fn start() -> KitResult<RedisTls> {
        Self::start_with(&[]).await
    }

    /// As [`RedisTls::start`], with `extra_args` for the server (after the TLS settings).
    ///
    /// # Cancel safety
    /// As [`RedisTls::start`].
    ///
    /// # Errors
    /// As [`RedisTls::start`].
    pub async fn start_with(extra_args: &[&str]) -> KitResult<RedisTls> {
        let files = TlsFiles::generate().await?;
        let tls_port = free_port();
        let (port, cert, key, ca) = (
            tls_port.to_string(),
            files.server_cert().display().to_string(),
            files.server_key().display().to_string(),
            files.ca_cert().display().to_string(),
        );
        let mut args = vec![
            "--tls-port",
            port.as_str(),
            "--tls-cert-file",
            cert.as_str(),
            "--tls-key-file",
            key.as_str(),
            "--tls-ca-cert-file",
            ca.as_str(),
            "--tls-auth-clients",
            "no",
        ];
        args.extend_from_slice(extra_args);
        let redis = Redis::start_with(&args).await?;
        Ok(RedisTls {
            redis,
            tls_port,
            files,
        })
    }

    /// `rediss://:{password}@127.0.0.1:{tls_port}` (add `?ca=` with [`RedisTls::ca_cert`] to
    /// trust the kit's CA).
    pub fn tls_url(&self) -> String {
        format!(
            "rediss://:{}@127.0.0.1:{}",
            lockcore::percent_encode(self.redis.password()),
            self.tls_port
        )
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The CA certificate clients should trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.files.ca_cert()
    }

    /// The server's certificates (to issue client certificates; the server trusts the same CA
    /// for them, which matters with `--tls-auth-clients yes`).
    pub fn tls(&self) -> &TlsFiles {
        &self.files
    }

    /// The server, through its plain port (admin commands, kill/pause/restart).
    pub fn redis(&self) -> &Redis {
        &self.redis
    }
}
