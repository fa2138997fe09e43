//! What this machine has, for the tests and runs that start real programs: PostgreSQL's and
//! MariaDB's server binaries, `redis-server`, the multithreaded libfaketime, `/dev/fuse`,
//! `nft` and `ip` (network namespaces).
//!
//! The crates that start these programs find them here at run time; build scripts call
//! [`emit_cfgs`] so that a test needing one that is missing is compiled as ignored ("PostgreSQL
//! not installed"), never reported as passed. One place for every probe: no dependencies, so
//! that a build script can depend on it without pulling in what the bench runs.

use std::path::{Path, PathBuf};

/// Something the real-process tests need from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Have {
    /// PostgreSQL's server programs ([`postgres_bin_dir`]): `cfg(has_postgres)`.
    Postgres,
    /// `redis-server` on PATH ([`redis_server_bin`]): `cfg(has_redis)`.
    Redis,
    /// The multithreaded libfaketime ([`libfaketime_path`]): `cfg(has_faketime)`.
    Faketime,
    /// `/dev/fuse` (the lost-writes filesystem): `cfg(has_fuse)`.
    Fuse,
    /// MariaDB's server programs ([`mariadb_bin`]): `cfg(has_mariadb)`.
    MariaDb,
    /// `nft` and `ip`, and root to use them (partitions at the IP level, in network
    /// namespaces): `cfg(has_nft)`.
    Nft,
}

impl Have {
    /// Every probe.
    pub const ALL: [Self; 6] = [
        Self::Postgres,
        Self::Redis,
        Self::Faketime,
        Self::Fuse,
        Self::MariaDb,
        Self::Nft,
    ];

    /// The `cfg` a build script sets when the machine has it.
    #[must_use]
    pub const fn cfg(self) -> &'static str {
        match self {
            Self::Postgres => "has_postgres",
            Self::Redis => "has_redis",
            Self::Faketime => "has_faketime",
            Self::Fuse => "has_fuse",
            Self::MariaDb => "has_mariadb",
            Self::Nft => "has_nft",
        }
    }

    /// Whether this machine has it.
    #[must_use]
    pub fn present(self) -> bool {
        match self {
            Self::Postgres => postgres_bin_dir().is_some(),
            Self::Redis => redis_server_bin().is_some(),
            Self::Faketime => libfaketime_path().is_some(),
            Self::Fuse => Path::new("/dev/fuse").exists(),
            Self::MariaDb => mariadb_bin("mariadbd").is_some(),
            Self::Nft => on_path("nft").is_some() && on_path("ip").is_some() && is_root(),
        }
    }

    /// What a build script watches to notice that it was installed or removed.
    const fn watched(self) -> &'static [&'static str] {
        match self {
            Self::Postgres => &["/usr/lib/postgresql"],
            Self::Redis => &[],
            Self::Faketime => &["/usr/lib/x86_64-linux-gnu/faketime"],
            Self::Fuse => &["/dev/fuse"],
            Self::MariaDb => &["/usr/sbin/mariadbd"],
            Self::Nft => &["/usr/sbin/nft"],
        }
    }
}

/// For a build script: declares every `cfg(has_*)` and sets those of `wanted` this machine has,
/// and asks to be rerun when what they depend on changes.
pub fn emit_cfgs(wanted: &[Have]) {
    for have in Have::ALL {
        println!("cargo::rustc-check-cfg=cfg({})", have.cfg());
    }
    println!("cargo::rerun-if-env-changed=PATH");
    for have in wanted {
        for path in have.watched() {
            println!("cargo::rerun-if-changed={path}");
        }
        if have.present() {
            println!("cargo::rustc-cfg={}", have.cfg());
        }
    }
}

/// Where Debian and a local build put the multithreaded libfaketime.
pub const LIBFAKETIME_PATHS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
];

/// Where the multithreaded libfaketime is, if installed.
#[must_use]
pub fn libfaketime_path() -> Option<PathBuf> {
    LIBFAKETIME_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The PostgreSQL server programs the bench runs, all from one directory.
pub const PG_PROGRAMS: [&str; 4] = ["initdb", "postgres", "pg_isready", "createdb"];

fn has_pg_programs(dir: &Path) -> bool {
    PG_PROGRAMS.iter().all(|p| dir.join(p).is_file())
}

/// Where `initdb`, `postgres`, `pg_isready` and `createdb` are: the first directory on PATH that
/// has them all, else the newest `/usr/lib/postgresql/*/bin`.
#[must_use]
pub fn postgres_bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|dir| has_pg_programs(dir)));
    on_path.or_else(newest_debian_pg_bin_dir)
}

fn newest_debian_pg_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_pg_programs(&bin).then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

/// `redis-server` on PATH, if installed.
#[must_use]
pub fn redis_server_bin() -> Option<PathBuf> {
    on_path("redis-server")
}

/// `program` on PATH, if it is there.
#[must_use]
pub fn on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The MariaDB programs the bench runs: the server, the data-directory installer, the admin
/// client (for its readiness ping) and the SQL client.
pub const MARIADB_PROGRAMS: [&str; 4] =
    ["mariadbd", "mariadb-install-db", "mariadb-admin", "mariadb"];

/// Where MariaDB's `program` (one of [`MARIADB_PROGRAMS`]) is: on PATH, else in `/usr/sbin`
/// (Debian puts the server there, out of a plain user's PATH); `None` unless every one of
/// them is found.
#[must_use]
pub fn mariadb_bin(program: &str) -> Option<PathBuf> {
    let find = |p: &str| {
        on_path(p).or_else(|| Some(Path::new("/usr/sbin").join(p)).filter(|f| f.is_file()))
    };
    MARIADB_PROGRAMS
        .iter()
        .all(|p| find(p).is_some())
        .then(|| find(program))?
}

/// Whether this process runs as root (its effective uid in `/proc/self/status` is 0).
#[must_use]
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_found_program_is_a_file_in_the_directory_named() {
        if let Some(dir) = postgres_bin_dir() {
            assert!(has_pg_programs(&dir), "{}", dir.display());
        }
        if let Some(bin) = redis_server_bin() {
            assert!(bin.is_file() && bin.ends_with("redis-server"));
        }
        if let Some(lib) = libfaketime_path() {
            assert!(LIBFAKETIME_PATHS.contains(&lib.to_str().unwrap()));
        }
    }

    #[test]
    fn every_probe_has_its_own_cfg() {
        let cfgs: std::collections::BTreeSet<_> = Have::ALL.iter().map(|h| h.cfg()).collect();
        assert_eq!(cfgs.len(), Have::ALL.len());
        assert!(cfgs.iter().all(|c| c.starts_with("has_")));
    }
}
