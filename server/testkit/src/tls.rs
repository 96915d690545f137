//! Certificates made by a test for the servers it starts (NATS, PostgreSQL) and the clients it
//! runs: a throw-away certificate authority whose files live in the test's directory.
//!
//! ```no_run
//! let ca = testkit::tls::TestCa::new(&testkit::temp_dir("tls"));
//! let server = ca.server("nats", &["localhost", "127.0.0.1"]); // cert + key files
//! let client = ca.client("worker-1");
//! // ca.ca_file() is what a client (or a server checking client certificates) trusts
//! ```

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its private key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate authority of one test (see the module docs).
pub struct TestCa {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    ca_file: PathBuf,
}

impl TestCa {
    /// A new authority whose files (`ca.pem`, and every certificate it issues) go to `dir`.
    pub fn new(dir: &Path) -> TestCa {
        std::fs::create_dir_all(dir).expect("the test's certificate directory");
        let mut params = CertificateParams::default();
        params.distinguished_name = name("millrace test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let cert = params.self_signed(&key).expect("the CA certificate");
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, cert.pem()).expect("ca.pem");
        TestCa { dir: dir.to_path_buf(), issuer: Issuer::new(params, key), ca_file }
    }

    /// The authority's certificate (PEM): what a peer that checks certificates trusts.
    pub fn ca_file(&self) -> PathBuf {
        self.ca_file.clone()
    }

    /// A server certificate for `names` (DNS names, or IP addresses such as `127.0.0.1`),
    /// written as `{file}.pem` / `{file}.key`.
    pub fn server(&self, file: &str, names: &[&str]) -> CertFiles {
        self.issue(file, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose common name is `name`, written as `{name}.pem` / `{name}.key`.
    pub fn client(&self, name: &str) -> CertFiles {
        self.issue(name, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, file: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> CertFiles {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(file);
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().expect("a DNS name")),
            })
            .collect();
        params.key_usages =
            vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("certificate file");
        write_private(&files.key, key.serialize_pem().as_bytes());
        files
    }
}

fn name(common: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common);
    dn
}

/// Writes a private key readable by its owner only (PostgreSQL refuses a key others can read).
fn write_private(path: &Path, pem: &[u8]) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("key file");
    f.write_all(pem).expect("key file");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_and_the_key_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = crate::temp_dir("tls-unit");
        let ca = TestCa::new(&dir);
        let s = ca.server("srv", &["localhost", "127.0.0.1"]);
        let c = ca.client("worker-1");
        for f in [ca.ca_file(), s.cert.clone(), c.cert.clone()] {
            assert!(std::fs::read_to_string(&f)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----"));
        }
        for k in [&s.key, &c.key] {
            assert!(std::fs::read_to_string(k).unwrap().contains("PRIVATE KEY"));
            assert_eq!(std::fs::metadata(k).unwrap().permissions().mode() & 0o777, 0o600);
        }
        eprintln!("{}", dir.display());
    }
}
