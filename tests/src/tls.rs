//! Throwaway PKIs for enclaves over TCP, made with the `openssl` command: a CA, the enclave's
//! server certificate (for `localhost` and 127.0.0.1), a gateway's client certificate, and a
//! client certificate from a CA the enclave does not trust.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `ca.pem`, `enclave.pem`/`enclave.key`, `gateway.pem`/`gateway.key`, and
    /// `rogue.pem`/`rogue.key` (issued by `rogue-ca.pem`) into `dir`.
    pub fn generate(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let key =
            |name: &str| run(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name]);
        for ca in ["ca", "rogue-ca"] {
            key(&format!("{ca}.key"));
            run(&[
                "req",
                "-x509",
                "-new",
                "-key",
                &format!("{ca}.key"),
                "-subj",
                &format!("/CN=coffer test {ca}"),
                "-days",
                "2",
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        std::fs::write(
            dir.join("server.ext"),
            "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        std::fs::write(dir.join("client.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n").unwrap();
        for (name, ca, ext) in
            [("enclave", "ca", "server.ext"), ("gateway", "ca", "client.ext"), ("rogue", "rogue-ca", "client.ext")]
        {
            key(&format!("{name}.key"));
            run(&[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-subj",
                &format!("/CN={name}"),
                "-out",
                &format!("{name}.csr"),
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                ext,
                "-out",
                &format!("{name}.pem"),
            ]);
        }
        Pki { dir: dir.to_path_buf() }
    }
}
