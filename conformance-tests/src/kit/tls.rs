//! Certificates for the kit's TLS servers and their clients: a CA, a server certificate (for
//! `127.0.0.1` and `localhost`) and, on request, client certificates, all made with the
//! `openssl` CLI in a temp dir (ECDSA P-256, valid 10 years).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::{KitError, KitErrorKind, KitResult};
use super::host::{RunAs, Workdir, find_binary, run_command, write_private};

/// A CA certificate plus certificates and keys signed by it, in a temp dir.
#[derive(Debug)]
pub struct TlsFiles {
    openssl: PathBuf,
    dir: Workdir,
}

/// A certificate and its private key (PEM files).
#[derive(Clone, Debug)]
pub struct CertAndKey {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (unencrypted PKCS#8).
    pub key: PathBuf,
}

/// Arguments for a new P-256 key, unencrypted.
const NEW_KEY: [&str; 6] = [
    "-nodes",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-keyout",
];

impl TlsFiles {
    /// Generates a fresh CA and a server certificate valid for `127.0.0.1` and `localhost`.
    ///
    /// # Cancel safety
    /// Dropping the future removes the temp dir and what was written into it.
    ///
    /// # Errors
    /// `openssl` missing (naming the package) or failing.
    pub async fn generate() -> KitResult<TlsFiles> {
        let openssl = find_binary("openssl", "openssl")?;
        let dir = Workdir::new("tls")?;
        let files = TlsFiles { openssl, dir };
        let mut ca = files.openssl(&["req", "-x509", "-new"]);
        ca.args(NEW_KEY).arg("ca.key").args([
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
        ]);
        run_command("openssl (CA)", ca).await?;
        files
            .issue(
                "server",
                "localhost",
                "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
            )
            .await?;
        Ok(files)
    }

    /// Issues a client certificate for `common_name` (servers that map certificates to
    /// accounts, as PostgreSQL's `cert` authentication does, read the account from it).
    /// Files are named after `common_name`, which must be a plain `[A-Za-z0-9_-]+` word.
    ///
    /// # Errors
    /// A bad name, or `openssl` failing.
    pub async fn issue_client(&self, common_name: &str) -> KitResult<CertAndKey> {
        let plain = !common_name.is_empty()
            && common_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !plain {
            return Err(KitError::new(
                KitErrorKind::InvalidArgument,
                format!("client certificate name {common_name:?} is not a plain word"),
            ));
        }
        self.issue(
            &format!("client-{common_name}"),
            common_name,
            "extendedKeyUsage=clientAuth\n",
        )
        .await
    }

    /// A key, and a certificate for `common_name` signed by the CA with `extensions` (after
    /// the ones every leaf gets), as `{stem}.key` and `{stem}.crt`.
    async fn issue(
        &self,
        stem: &str,
        common_name: &str,
        extensions: &str,
    ) -> KitResult<CertAndKey> {
        let d = self.dir.path();
        let (key, csr, crt, ext) = (
            format!("{stem}.key"),
            format!("{stem}.csr"),
            format!("{stem}.crt"),
            format!("{stem}.ext"),
        );
        std::fs::write(
            d.join(&ext),
            format!(
                "basicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature,keyEncipherment\n{extensions}"
            ),
        )
        .map_err(|e| KitError::io("cannot write the certificate extensions", e))?;
        let mut request = self.openssl(&["req", "-new"]);
        request.args(NEW_KEY).arg(&key).args([
            "-out",
            &csr,
            "-subj",
            &format!("/CN={common_name}"),
        ]);
        run_command("openssl (key and request)", request).await?;
        let mut sign = self.openssl(&["x509", "-req", "-in", &csr]);
        sign.args(["-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"])
            .args(["-out", &crt, "-days", "3650", "-extfile", &ext]);
        run_command("openssl (sign)", sign).await?;
        Ok(CertAndKey {
            cert: d.join(crt),
            key: d.join(key),
        })
    }

    fn openssl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.openssl);
        cmd.args(args).current_dir(self.dir.path());
        cmd
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

    /// Copies the server certificate, its key and the CA into a server's `dir` as
    /// `server.crt`, `server.key` and `ca.crt`, 0600 and owned by `run_as`: servers refuse a key
    /// others can read, and one that runs as its system account cannot enter this temp dir.
    ///
    /// # Errors
    /// A file that cannot be read or written.
    pub(crate) fn install_server_files(&self, dir: &Path, run_as: &RunAs) -> KitResult<()> {
        for (from, to) in [
            (self.server_cert(), "server.crt"),
            (self.server_key(), "server.key"),
            (self.ca_cert(), "ca.crt"),
        ] {
            let pem = std::fs::read_to_string(&from)
                .map_err(|e| KitError::io(format!("cannot read {}", from.display()), e))?;
            write_private(&dir.join(to), &pem, run_as)?;
        }
        Ok(())
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
