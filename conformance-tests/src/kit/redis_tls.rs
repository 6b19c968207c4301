//! A `redis-server` that also speaks TLS: the kit generates a CA and a server certificate (for
//! `127.0.0.1` and `localhost`) with the `openssl` CLI into a temp dir, and starts a [`Redis`]
//! with `--tls-port` next to its plain port (which the kit uses for readiness and admin
//! commands such as `ACL SETUSER`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::KitResult;
use super::free_port;
use super::process::{Workdir, find_binary, run_command};
use super::redis::Redis;

/// A CA certificate plus a server certificate and key signed by it, in a temp dir.
#[derive(Debug)]
pub struct TlsFiles {
    dir: Workdir,
}

impl TlsFiles {
    /// Generates a fresh CA and a server certificate valid for `127.0.0.1` and `localhost`
    /// (ECDSA P-256, 10 years).
    ///
    /// # Cancel safety
    /// Dropping the future removes the temp dir and what was written into it.
    ///
    /// # Errors
    /// `openssl` missing (naming the package) or failing.
    pub async fn generate() -> KitResult<TlsFiles> {
        let openssl = find_binary("openssl", "openssl")?;
        let dir = Workdir::new("tls")?;
        let files = TlsFiles { dir };
        let d = files.dir.path();
        let ext = d.join("server.ext");
        std::fs::write(
            &ext,
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .map_err(|e| super::KitError::io("cannot write the certificate extensions", e))?;
        let step = |args: &[&str]| {
            let mut cmd = Command::new(&openssl);
            cmd.args(args).current_dir(d);
            cmd
        };
        run_command(
            "openssl (CA)",
            step(&[
                "req",
                "-x509",
                "-new",
                "-nodes",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "3650",
                "-subj",
                "/CN=dlock kit test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]),
        )
        .await?;
        run_command(
            "openssl (server key and request)",
            step(&[
                "req",
                "-new",
                "-nodes",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ]),
        )
        .await?;
        run_command(
            "openssl (sign the server certificate)",
            step(&[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "3650",
                "-extfile",
                "server.ext",
            ]),
        )
        .await?;
        Ok(files)
    }

    /// The CA certificate (PEM) clients should trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server certificate (PEM).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A private `redis-server` with a plain port and a TLS port (clients need no certificate).
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

    /// `rediss://127.0.0.1:{tls_port}` (add `?ca=` with [`RedisTls::ca_cert`] to trust the kit's CA).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The CA certificate clients should trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.files.ca_cert()
    }

    /// The server, through its plain port (admin commands, kill/pause/restart).
    pub fn redis(&self) -> &Redis {
        &self.redis
    }
}
