//! The NATS connection flags both binaries share: TLS and authentication.
//!
//! Flattened into `shoal-server`'s and `shoal-ingester`'s arguments; [`NatsArgs::options`]
//! reads the files they name and builds the [`NatsOptions`].

use super::nats::{ClientCert, NatsAuth, NatsOptions, NatsTls};
use crate::secret::Secret;
use std::path::{Path, PathBuf};

/// NATS TLS and authentication flags. At most one authentication method.
#[derive(Debug, Clone, Default, clap::Args)]
#[group(skip)]
#[command(group(
    clap::ArgGroup::new("nats_auth")
        .args(["nats_creds", "nats_nkey", "nats_user", "nats_token", "nats_token_file"])
        .multiple(false)
))]
pub struct NatsArgs {
    /// NATS credentials file (.creds: user JWT and nkey seed). One authentication method
    /// at most: --nats-creds, --nats-nkey, --nats-user, --nats-token(-file).
    #[arg(long, env = "SHOAL_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,

    /// File holding a NATS nkey seed (SU...), for nkey authentication.
    #[arg(long, env = "SHOAL_NATS_NKEY", value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,

    /// NATS user name, for user/password authentication (with --nats-password or
    /// --nats-password-file).
    #[arg(long, env = "SHOAL_NATS_USER", value_name = "USER")]
    pub nats_user: Option<String>,

    /// NATS password for --nats-user. Prefer --nats-password-file or the environment
    /// variable: command lines are visible to every process on the host.
    #[arg(
        long,
        env = "SHOAL_NATS_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true,
        requires = "nats_user",
        conflicts_with = "nats_password_file"
    )]
    pub nats_password: Option<Secret>,

    /// File holding the NATS password for --nats-user (one trailing newline is ignored).
    #[arg(
        long,
        env = "SHOAL_NATS_PASSWORD_FILE",
        value_name = "FILE",
        requires = "nats_user"
    )]
    pub nats_password_file: Option<PathBuf>,

    /// NATS authorization token. Prefer --nats-token-file or the environment variable.
    #[arg(
        long,
        env = "SHOAL_NATS_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub nats_token: Option<Secret>,

    /// File holding the NATS authorization token (one trailing newline is ignored).
    #[arg(long, env = "SHOAL_NATS_TOKEN_FILE", value_name = "FILE")]
    pub nats_token_file: Option<PathBuf>,

    /// PEM file of the CA certificate(s) that verify the NATS server's certificate
    /// (default: the system's roots). Implies TLS.
    #[arg(long, env = "SHOAL_NATS_TLS_CA", value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for mutual TLS with NATS; needs --nats-tls-key. Implies TLS.
    #[arg(
        long,
        env = "SHOAL_NATS_TLS_CERT",
        value_name = "FILE",
        requires = "nats_tls_key"
    )]
    pub nats_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --nats-tls-cert.
    #[arg(
        long,
        env = "SHOAL_NATS_TLS_KEY",
        value_name = "FILE",
        requires = "nats_tls_cert"
    )]
    pub nats_tls_key: Option<PathBuf>,

    /// Require TLS to NATS even when no TLS file is given (the server is then verified
    /// against the system's roots). Also implied by a tls:// URL.
    #[arg(
        long,
        env = "SHOAL_NATS_TLS_REQUIRED",
        value_name = "BOOL",
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub nats_tls_required: bool,
}

/// A NATS flag whose file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NatsArgsError {
    /// The file cannot be read.
    #[error("{flag} {}: cannot read it: {error}", path.display())]
    Read {
        /// The flag and its variable.
        flag: &'static str,
        /// The path given.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The file does not hold what the flag needs.
    #[error("{flag} {}: {problem}", path.display())]
    Invalid {
        /// The flag and its variable.
        flag: &'static str,
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        problem: &'static str,
    },
}

const CREDS: &str = "--nats-creds (SHOAL_NATS_CREDS)";
const NKEY: &str = "--nats-nkey (SHOAL_NATS_NKEY)";
const PASSWORD_FILE: &str = "--nats-password-file (SHOAL_NATS_PASSWORD_FILE)";
const TOKEN_FILE: &str = "--nats-token-file (SHOAL_NATS_TOKEN_FILE)";
const TLS_CA: &str = "--nats-tls-ca (SHOAL_NATS_TLS_CA)";
const TLS_CERT: &str = "--nats-tls-cert (SHOAL_NATS_TLS_CERT)";
const TLS_KEY: &str = "--nats-tls-key (SHOAL_NATS_TLS_KEY)";

impl NatsArgs {
    /// The connection options for `url`, reading (and checking) every file named.
    pub fn options(&self, url: &str, replicas: usize) -> Result<NatsOptions, NatsArgsError> {
        Ok(NatsOptions {
            url: url.to_string(),
            replicas,
            auth: self.auth()?,
            tls: self.tls()?,
        })
    }

    fn auth(&self) -> Result<NatsAuth, NatsArgsError> {
        if let Some(path) = &self.nats_creds {
            read(CREDS, path)?;
            return Ok(NatsAuth::CredentialsFile(path.clone()));
        }
        if let Some(path) = &self.nats_nkey {
            let text = read(NKEY, path)?;
            let seed = text
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or_default();
            if !seed.starts_with("SU") {
                return Err(invalid(
                    NKEY,
                    path,
                    "not an nkey user seed (a line starting with SU)",
                ));
            }
            return Ok(NatsAuth::NKey(Secret::new(seed)));
        }
        if let Some(user) = &self.nats_user {
            let password = match (&self.nats_password, &self.nats_password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(path)) => Secret::new(secret_file(PASSWORD_FILE, path)?),
                // clap's `requires` makes --nats-password* come with --nats-user, not the
                // other way round: a user without a password is allowed (an empty one).
                (None, None) => Secret::new(""),
            };
            return Ok(NatsAuth::UserPassword {
                user: user.clone(),
                password,
            });
        }
        if let Some(token) = &self.nats_token {
            return Ok(NatsAuth::Token(token.clone()));
        }
        if let Some(path) = &self.nats_token_file {
            return Ok(NatsAuth::Token(Secret::new(secret_file(TOKEN_FILE, path)?)));
        }
        Ok(NatsAuth::None)
    }

    fn tls(&self) -> Result<NatsTls, NatsArgsError> {
        if let Some(ca) = &self.nats_tls_ca {
            pem(TLS_CA, ca, "CERTIFICATE-----")?;
        }
        let client_cert = match (&self.nats_tls_cert, &self.nats_tls_key) {
            (Some(cert), Some(key)) => {
                pem(TLS_CERT, cert, "CERTIFICATE-----")?;
                pem(TLS_KEY, key, "PRIVATE KEY-----")?;
                Some(ClientCert {
                    cert_file: cert.clone(),
                    key_file: key.clone(),
                })
            }
            // clap's `requires` rejects one without the other.
            _ => None,
        };
        Ok(NatsTls {
            required: self.nats_tls_required,
            ca_file: self.nats_tls_ca.clone(),
            client_cert,
        })
    }
}

fn read(flag: &'static str, path: &Path) -> Result<String, NatsArgsError> {
    std::fs::read_to_string(path).map_err(|error| NatsArgsError::Read {
        flag,
        path: path.to_path_buf(),
        error,
    })
}

fn invalid(flag: &'static str, path: &Path, problem: &'static str) -> NatsArgsError {
    NatsArgsError::Invalid {
        flag,
        path: path.to_path_buf(),
        problem,
    }
}

/// A secret file's content without its trailing line end; empty is an error.
fn secret_file(flag: &'static str, path: &Path) -> Result<String, NatsArgsError> {
    let text = read(flag, path)?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.is_empty() {
        return Err(invalid(flag, path, "the file is empty"));
    }
    Ok(value.to_string())
}

/// Checks that a PEM file holds a block whose `-----BEGIN` line ends with `label_end`.
fn pem(flag: &'static str, path: &Path, label_end: &str) -> Result<(), NatsArgsError> {
    let text = read(flag, path)?;
    let found = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(label_end));
    if found {
        Ok(())
    } else if label_end.starts_with("PRIVATE") {
        Err(invalid(flag, path, "no PEM private key in the file"))
    } else {
        Err(invalid(flag, path, "no PEM certificate in the file"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        nats: NatsArgs,
    }

    fn parse(args: &[&str]) -> Result<NatsArgs, clap::Error> {
        let mut all = vec!["test"];
        all.extend(args);
        Cli::try_parse_from(all).map(|c| c.nats)
    }

    #[test]
    fn two_auth_methods_are_refused() {
        let e = parse(&[
            "--nats-user",
            "u",
            "--nats-password",
            "p",
            "--nats-token",
            "t",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot be used with"), "{e}");
        let e = parse(&["--nats-creds", "a", "--nats-nkey", "b"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be used with"), "{e}");
    }

    #[test]
    fn password_needs_user_and_cert_needs_key() {
        assert!(parse(&["--nats-password", "p"]).is_err());
        assert!(parse(&["--nats-tls-cert", "c"]).is_err());
        assert!(parse(&["--nats-tls-key", "k"]).is_err());
        assert!(parse(&[
            "--nats-password",
            "p",
            "--nats-password-file",
            "f",
            "--nats-user",
            "u"
        ])
        .is_err());
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let args = parse(&["--nats-user", "admin", "--nats-password", "hunter2"]).unwrap();
        let opts = args.options("nats://x:4222", 1).unwrap();
        let shown = format!("{args:?} {opts:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("admin"), "{shown}");
    }

    #[test]
    fn files_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("password");
        std::fs::write(&pw, "s3cret\n").unwrap();
        let args = parse(&[
            "--nats-user",
            "u",
            "--nats-password-file",
            pw.to_str().unwrap(),
        ])
        .unwrap();
        assert_eq!(
            args.options("nats://x", 1).unwrap().auth,
            NatsAuth::UserPassword {
                user: "u".into(),
                password: Secret::new("s3cret")
            }
        );

        let missing = dir.path().join("missing.pem");
        let args = parse(&["--nats-tls-ca", missing.to_str().unwrap()]).unwrap();
        let e = args.options("nats://x", 1).unwrap_err().to_string();
        assert!(e.starts_with("--nats-tls-ca (SHOAL_NATS_TLS_CA)"), "{e}");
        assert!(e.contains("missing.pem"), "{e}");

        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let args = parse(&["--nats-tls-ca", not_pem.to_str().unwrap()]).unwrap();
        let e = args.options("nats://x", 1).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate"), "{e}");

        let empty = dir.path().join("token");
        std::fs::write(&empty, "\n").unwrap();
        let args = parse(&["--nats-token-file", empty.to_str().unwrap()]).unwrap();
        let e = args.options("nats://x", 1).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");

        let seed = dir.path().join("seed");
        std::fs::write(&seed, "not a seed\n").unwrap();
        let args = parse(&["--nats-nkey", seed.to_str().unwrap()]).unwrap();
        let e = args.options("nats://x", 1).unwrap_err().to_string();
        assert!(e.contains("nkey user seed"), "{e}");
    }

    #[test]
    fn tls_is_implied_by_its_files() {
        let args = parse(&[]).unwrap();
        assert!(!args.options("nats://x", 1).unwrap().tls.is_required());
        let args = parse(&["--nats-tls-required"]).unwrap();
        assert!(args.options("nats://x", 1).unwrap().tls.is_required());
        let args = parse(&["--nats-tls-required=false"]).unwrap();
        assert!(!args.options("nats://x", 1).unwrap().tls.is_required());
    }
}
