//! Certificates for the kit's TLS servers: a CA and a server certificate (for `127.0.0.1` and
//! `localhost`), made with the `openssl` CLI in a temp dir.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::KitResult;
use super::process::{Workdir, find_binary, run_command};

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
