//! The VM kernel test (`cargo xtask vm-test`): boots Debian 12's stock kernel
//! under qemu (TCG) and runs the eBPF integration tests inside it, once per
//! attach strategy that kernel should support, and the task iterators'
//! tests once.
//!
//! This module owns every step of that: fetching and caching the kernel
//! (`target/vm/kernel/`), building the test binaries, packing an initramfs
//! (busybox, the binaries at their build paths, their shared libraries and a
//! generated `/init`), booting it with a timeout while streaming the serial
//! console to the terminal and `target/vm/serial.log`, and judging the run from
//! the markers `/init` prints around each case.
//!
//! The host kernel cannot prove the kprobe or fentry strategies (kprobes are
//! compiled out, fentry is refused), hence a stock kernel in a VM. `/dev/kvm`
//! here cannot boot one, so qemu runs with TCG only.

use std::{
    collections::BTreeSet,
    fmt,
    fs::{self, File},
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc::{self, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::run;

/// One run of the test binary inside the VM: a name for the summary and the
/// environment that selects (or forces) the strategy under test.
struct Case {
    name: &'static str,
    env: &'static [(&'static str, &'static str)],
    /// The case's own test filter, run whatever `--filter` says; `None`:
    /// the run's filter.
    filter: Option<&'static str>,
    /// Shell commands `/init` runs just before the case (the cases after
    /// it see what they change).
    before: &'static str,
}

/// Every case runs in the same boot, in this order (the case that hides
/// the kernel's BTF is last). Adding a strategy is one line here.
const CASES: &[Case] = &[
    // Unforced: the loader must pick kprobe on a stock kernel.
    Case {
        name: "kprobe",
        env: &[("SELFHEAL_EXPECT_STRATEGY", "kprobe")],
        filter: None,
        before: "",
    },
    Case {
        name: "fentry",
        env: &[
            ("SELFHEAL_FORCE_STRATEGY", "fentry"),
            ("SELFHEAL_EXPECT_STRATEGY", "fentry"),
        ],
        filter: None,
        before: "",
    },
    // The task iterators (`iter/task` linked per process by pidfd, and
    // `iter/task_file`) on the oldest kernel they need: against procfs,
    // through the collector, and from pins.
    Case {
        name: "iterators",
        env: &[],
        filter: Some("iter::"),
        before: "",
    },
    // A kernel that cannot run the iterators (its BTF hidden, as a kernel
    // built without it has none), with no pins left by the cases above:
    // the collector falls back to procfs and says why.
    Case {
        name: "fallback",
        env: &[("SELFHEAL_EXPECT_NO_BTF", "1")],
        filter: Some("fallback::"),
        before: "rm -rf /sys/fs/bpf/selfheal /run/selfheal/bpf\n\
                 mount --bind /dev/null /sys/kernel/btf/vmlinux \
                 || echo \"SELFHEAL-VM-WARN cannot hide the kernel's BTF\"\n",
    },
];

/// Environment every case gets, on top of its own.
const COMMON_ENV: &[(&str, &str)] = &[("RUST_BACKTRACE", "1"), ("SELFHEAL_REQUIRE_EBPF", "1")];

const DEFAULT_PACKAGE: &str = "tests";
const DEFAULT_TEST_TARGET: &str = "it";
const DEFAULT_FILTER: &str = "ebpf::blocked_recv";
const DEFAULT_TIMEOUT_SECS: u64 = 600;

/// Debian's kernel metapackage; it depends on the current versioned image.
const KERNEL_METAPACKAGE: &str = "linux-image-amd64";
/// busybox-static's binary: the VM's whole userland.
const BUSYBOX: &str = "/bin/busybox";
const QEMU: &str = "qemu-system-x86_64";
/// TCG only (this host's `/dev/kvm` cannot boot a stock kernel); 1 GiB, one
/// CPU, the serial console on stdio; a panic (`panic=-1`) ends qemu.
const QEMU_ARGS: &[&str] = &[
    "-accel",
    "tcg",
    "-cpu",
    "max",
    "-m",
    "1024",
    "-smp",
    "1",
    "-nographic",
    "-no-reboot",
];
const KERNEL_CMDLINE: &str = "console=ttyS0 panic=-1 quiet";

/// Markers `/init` prints on the console; the run is judged from them.
const CASE_MARKER: &str = "SELFHEAL-VM-CASE";
const INIT_MARKER: &str = "SELFHEAL-VM-INIT";
const DONE_MARKER: &str = "SELFHEAL-VM-DONE";
/// libtest's line when the name filter matched nothing (a vacuous pass).
const NO_TESTS_LINE: &str = "running 0 tests";

/// Options of `cargo xtask vm-test`. `VmArgs::default()` (what `cargo xtask
/// test` uses) means the same as giving no option.
#[derive(clap::Args, Default)]
pub struct VmArgs {
    /// Cargo package holding the integration test and its helper binaries.
    #[arg(long, short = 'p', value_name = "PACKAGE", default_value = DEFAULT_PACKAGE)]
    package: Option<String>,
    /// Integration-test target of that package to run in the VM.
    #[arg(long = "test", value_name = "TARGET", default_value = DEFAULT_TEST_TARGET)]
    test_target: Option<String>,
    /// libtest name filter passed to the test binary.
    #[arg(long, value_name = "FILTER", default_value = DEFAULT_FILTER)]
    filter: Option<String>,
    /// Give up (and kill qemu) after this many seconds from boot.
    #[arg(long, value_name = "SECS", default_value = "600")]
    timeout_secs: Option<u64>,
    /// Run this executable as the test binary instead of building one (no
    /// cargo build, no helper binaries). For developing the VM harness.
    #[arg(long, value_name = "PATH", hide = true)]
    test_exe: Option<PathBuf>,
}

impl VmArgs {
    fn package(&self) -> &str {
        self.package.as_deref().unwrap_or(DEFAULT_PACKAGE)
    }
    fn test_target(&self) -> &str {
        self.test_target.as_deref().unwrap_or(DEFAULT_TEST_TARGET)
    }
    fn filter(&self) -> &str {
        self.filter.as_deref().unwrap_or(DEFAULT_FILTER)
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS))
    }
}

pub fn vm_test(args: VmArgs) -> Result<()> {
    let root = workspace_root();
    let vm_dir = root.join("target/vm");
    fs::create_dir_all(&vm_dir).with_context(|| format!("cannot create {}", vm_dir.display()))?;

    let kernel = debian_kernel(&vm_dir.join("kernel"))?;
    eprintln!(
        "vm-test: kernel {} ({} {})",
        kernel.vmlinuz.display(),
        kernel.package,
        kernel.version
    );

    let binaries = match &args.test_exe {
        Some(exe) => TestBinaries {
            test: absolute(exe)?,
            helpers: Vec::new(),
            selfheal: None,
        },
        None => build_test_binaries(&root, args.package(), args.test_target())?,
    };
    let init = init_script(&binaries.test, binaries.selfheal.as_deref(), args.filter());
    let initramfs = build_initramfs(&vm_dir, &binaries, &kernel.modules, &init)?;

    let log = vm_dir.join("serial.log");
    let boot = boot(&kernel.vmlinuz, &initramfs, &log, args.timeout())?;
    let outcomes = case_outcomes(&boot.lines);
    print_summary(&kernel, &boot, &outcomes, &log);
    verdict(&boot, &outcomes, args.filter(), &log)
}

/// The workspace root: xtask lives in its `xtask/` folder.
fn workspace_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask
        .parent()
        .map_or_else(|| xtask.to_path_buf(), Path::to_path_buf)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    fs::canonicalize(path).with_context(|| format!("cannot resolve {}", path.display()))
}

// ---------------------------------------------------------------------------
// The kernel

struct Kernel {
    /// The versioned image package, e.g. `linux-image-6.1.0-57-amd64`.
    package: String,
    /// Its Debian version, e.g. `6.1.192-3`.
    version: String,
    vmlinuz: PathBuf,
    /// `lib/modules/<release>/` of the unpacked image.
    modules: PathBuf,
}

/// Modules the tests need that Debian builds as modules, in load order,
/// relative to `lib/modules/<release>/`: sock_diag for TCP (what `ss` uses).
const MODULES: &[&str] = &[
    "kernel/net/ipv4/inet_diag.ko",
    "kernel/net/ipv4/tcp_diag.ko",
];

/// Debian 12's current stock kernel, downloaded and unpacked once into
/// `cache/<package>/`, reused after that.
fn debian_kernel(cache: &Path) -> Result<Kernel> {
    let package = match kernel_package() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("vm-test: {e:#}; refreshing the package lists");
            apt_get_update()?;
            kernel_package()?
        }
    };
    let dir = cache.join(&package);
    let deb = download_deb(&package, &dir.join("deb"))?;
    let version = deb_version(&deb)?;
    let unpacked = dir.join("root");
    if !unpacked.is_dir() {
        unpack_deb(&deb, &unpacked)?;
    }
    let vmlinuz = find_vmlinuz(&unpacked.join("boot"))?;
    let modules_root = unpacked.join("lib/modules");
    let release = read_dir_names(&modules_root)?
        .into_iter()
        .next()
        .with_context(|| format!("no kernel release under {}", modules_root.display()))?;
    Ok(Kernel {
        package,
        version,
        vmlinuz,
        modules: modules_root.join(release),
    })
}

/// The versioned image `linux-image-amd64` depends on.
fn kernel_package() -> Result<String> {
    let out = output(Command::new("apt-cache").args(["depends", KERNEL_METAPACKAGE]))?;
    versioned_image(&out).with_context(|| {
        format!("`apt-cache depends {KERNEL_METAPACKAGE}` names no linux-image package")
    })
}

/// Picks the first `Depends: linux-image-…` line of `apt-cache depends`.
fn versioned_image(apt_cache_depends: &str) -> Option<String> {
    apt_cache_depends.lines().find_map(|line| {
        let dep = line
            .trim()
            .trim_start_matches('|')
            .strip_prefix("Depends:")?
            .trim();
        let dep = dep.trim_start_matches('<').trim_end_matches('>');
        dep.starts_with("linux-image-").then(|| dep.to_owned())
    })
}

/// The Debian version in a .deb's name (`<package>_<version>_<arch>.deb`,
/// the epoch's colon written `%3a`), for the report.
fn deb_version(deb: &Path) -> Result<String> {
    deb.file_name()
        .and_then(|n| n.to_str()?.split('_').nth(1))
        .map(|v| v.replace("%3a", ":"))
        .with_context(|| format!("no version in the name of {}", deb.display()))
}

/// `apt-get download`s `package` into `dir` unless a .deb of it is there;
/// refreshes the package lists and retries once if the download fails.
fn download_deb(package: &str, dir: &Path) -> Result<PathBuf> {
    if let Some(deb) = find_deb(package, dir)? {
        return Ok(deb);
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    eprintln!("vm-test: downloading {package} into {}", dir.display());
    let download = || {
        run_in(
            dir,
            Command::new("apt-get").args(["download", "-q", package]),
        )
    };
    if let Err(e) = download() {
        eprintln!("vm-test: {e:#}; refreshing the package lists and retrying");
        apt_get_update()?;
        download()?;
    }
    find_deb(package, dir)?.with_context(|| {
        format!(
            "apt-get download {package} left no .deb in {}",
            dir.display()
        )
    })
}

fn find_deb(package: &str, dir: &Path) -> Result<Option<PathBuf>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let prefix = format!("{package}_");
    // One per folder in practice: the folder is named after the package.
    let debs = read_dir_names(dir)?
        .into_iter()
        .filter(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        .max();
    Ok(debs.map(|n| dir.join(n)))
}

/// `dpkg -x` into a temporary folder renamed into place, so an interrupted
/// run never leaves a half-unpacked cache that would be reused.
fn unpack_deb(deb: &Path, dest: &Path) -> Result<()> {
    let tmp = dest.with_extension("partial");
    if tmp.exists() {
        fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    eprintln!("vm-test: unpacking {}", deb.display());
    run(Command::new("dpkg").arg("-x").arg(deb).arg(&tmp))?;
    fs::rename(&tmp, dest)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), dest.display()))
}

fn find_vmlinuz(boot: &Path) -> Result<PathBuf> {
    read_dir_names(boot)?
        .into_iter()
        .find(|n| n.starts_with("vmlinuz-"))
        .map(|n| boot.join(n))
        .with_context(|| format!("no vmlinuz-* in {}", boot.display()))
}

fn apt_get_update() -> Result<()> {
    run(Command::new("apt-get").args(["update", "-q"]))
}

// ---------------------------------------------------------------------------
// The test binaries

struct TestBinaries {
    /// The libtest harness run once per case.
    test: PathBuf,
    /// The package's `[[bin]]`s, which the test finds at their build paths.
    helpers: Vec<PathBuf>,
    /// The `selfheal` binary, which tests that run a helper of their own
    /// start (`SELFHEAL_TEST_BIN`: there is no cargo in the VM to build it).
    selfheal: Option<PathBuf>,
}

/// Host programs the VM's tests run that busybox lacks or has in part
/// (its `setpriv` has no `--reuid`), staged with their libraries over
/// busybox's applets of the same name; and dash, which is `/bin/sh`:
/// busybox's shell runs its own applet for a name before any on `PATH`.
const HOST_TOOLS: &[&str] = &["/usr/bin/setpriv", "/usr/bin/unshare", "/bin/dash"];

/// `/etc/passwd` and `/etc/group` of the VM: the names `stat -c %U` prints
/// for the users the tests run as.
const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// One executable cargo reported building.
/// The helper programs (binaries of the tests crate) the VM's tests use.
const VM_HELPERS: &[&str] = &["recv-peer"];

struct Artifact {
    name: String,
    kinds: Vec<String>,
    test: bool,
    executable: PathBuf,
}

fn build_test_binaries(root: &Path, package: &str, test_target: &str) -> Result<TestBinaries> {
    let tests = cargo_artifacts(
        root,
        &["test", "-p", package, "--test", test_target, "--no-run"],
    )?;
    let test = tests
        .into_iter()
        .find(|a| a.test && a.name == test_target)
        .map(|a| a.executable)
        .with_context(|| {
            format!("cargo built no test executable for {package} --test {test_target}")
        })?;
    // Only the helper programs the VM's tests run: every binary of the
    // crate together is hundreds of MiB of debug build, more than the VM's
    // memory holds as an initramfs.
    let helpers = cargo_artifacts(root, &["build", "-p", package, "--bins"])?
        .into_iter()
        .filter(|a| {
            !a.test && a.kinds.iter().any(|k| k == "bin") && VM_HELPERS.contains(&a.name.as_str())
        })
        .map(|a| a.executable)
        .collect();
    let selfheal = cargo_artifacts(root, &["build", "-p", "selfheal", "--bin", "selfheal"])?
        .into_iter()
        .find(|a| !a.test && a.name == "selfheal")
        .map(|a| a.executable)
        .context("cargo built no selfheal binary")?;
    Ok(TestBinaries {
        test,
        helpers,
        selfheal: Some(selfheal),
    })
}

/// Runs `cargo <args> --message-format=json` with the eBPF object required,
/// and returns the executables it reports (fresh or rebuilt).
fn cargo_artifacts(root: &Path, args: &[&str]) -> Result<Vec<Artifact>> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args)
        .arg("--message-format=json")
        .env("SELFHEAL_REQUIRE_EBPF", "1")
        .current_dir(root)
        .stderr(Stdio::inherit());
    let out = output(&mut cmd)?;
    let mut artifacts = Vec::new();
    for line in out.lines() {
        let msg: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{cmd:?} printed a line that is not JSON: {line}"))?;
        artifacts.extend(artifact(&msg));
    }
    Ok(artifacts)
}

/// The executable a `compiler-artifact` message names, if any.
fn artifact(msg: &serde_json::Value) -> Option<Artifact> {
    if msg["reason"] != "compiler-artifact" {
        return None;
    }
    let executable = PathBuf::from(msg["executable"].as_str()?);
    let target = &msg["target"];
    Some(Artifact {
        name: target["name"].as_str()?.to_owned(),
        kinds: target["kind"]
            .as_array()?
            .iter()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect(),
        test: msg["profile"]["test"].as_bool()?,
        executable,
    })
}

// ---------------------------------------------------------------------------
// The initramfs

/// Stages the VM's root file system under `vm_dir/initramfs/` and packs it
/// into `vm_dir/initramfs.cpio` (newc, uncompressed: TCG is slow to inflate).
fn build_initramfs(
    vm_dir: &Path,
    binaries: &TestBinaries,
    modules: &Path,
    init: &str,
) -> Result<PathBuf> {
    let staging = vm_dir.join("initramfs");
    if staging.exists() {
        fs::remove_dir_all(&staging)
            .with_context(|| format!("cannot remove {}", staging.display()))?;
    }
    for dir in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "root", "etc", "run",
    ] {
        let d = staging.join(dir);
        fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    install_busybox(&staging)?;

    let mut files = BTreeSet::new();
    let tools = HOST_TOOLS.iter().map(PathBuf::from);
    for exe in std::iter::once(binaries.test.clone())
        .chain(binaries.helpers.iter().cloned())
        .chain(binaries.selfheal.clone())
        .chain(tools)
    {
        files.extend(shared_libraries(&exe)?);
        files.insert(exe);
    }
    for file in &files {
        stage_file(&staging, file)?;
    }

    // Modules as /modules/<load order>-<name>.ko, loaded by /init in order.
    let module_dir = staging.join("modules");
    fs::create_dir_all(&module_dir)
        .with_context(|| format!("cannot create {}", module_dir.display()))?;
    for (i, rel) in MODULES.iter().enumerate() {
        let src = modules.join(rel);
        let name = Path::new(rel)
            .file_name()
            .context("module path has a file name")?;
        let dst = module_dir.join(format!("{i}-{}", name.to_string_lossy()));
        fs::copy(&src, &dst)
            .with_context(|| format!("cannot copy {} to {}", src.display(), dst.display()))?;
    }

    let sh = staging.join("bin/sh");
    fs::remove_file(&sh).with_context(|| format!("cannot remove {}", sh.display()))?;
    std::os::unix::fs::symlink("dash", &sh)
        .with_context(|| format!("cannot link {} to dash", sh.display()))?;
    fs::write(staging.join("etc/passwd"), PASSWD).context("cannot write /etc/passwd")?;
    fs::write(staging.join("etc/group"), GROUP).context("cannot write /etc/group")?;

    let init_path = staging.join("init");
    write_executable(&init_path, init)?;

    let cpio = vm_dir.join("initramfs.cpio");
    pack_cpio(&staging, &cpio)?;
    let size = fs::metadata(&cpio)
        .with_context(|| format!("cannot stat {}", cpio.display()))?
        .len();
    eprintln!(
        "vm-test: initramfs {} ({} files, {} MiB)",
        cpio.display(),
        files.len() + 2,
        size >> 20
    );
    Ok(cpio)
}

/// Copies the static busybox to /bin/busybox and links every applet to it.
fn install_busybox(staging: &Path) -> Result<()> {
    let busybox = Path::new(BUSYBOX);
    if !shared_libraries(busybox)?.is_empty() {
        bail!("{BUSYBOX} is not static: install busybox-static (`cargo xtask setup` does)");
    }
    stage_file(staging, busybox)?;
    let applets = output(Command::new(BUSYBOX).arg("--list-full"))?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let link = staging.join(applet);
        if link.exists() {
            continue; // bin/busybox itself
        }
        if let Some(dir) = link.parent() {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::os::unix::fs::symlink(BUSYBOX, &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    Ok(())
}

/// The shared libraries `exe` loads, the dynamic loader included, as `ldd`
/// resolves them; none for a static executable.
fn shared_libraries(exe: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(exe)
        .output()
        .context("cannot run ldd")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stdout.contains("not a dynamic executable")
            || stderr.contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        bail!(
            "ldd {} failed ({}): {}",
            exe.display(),
            out.status,
            stderr.trim()
        );
    }
    parse_ldd(&stdout).with_context(|| format!("ldd {}", exe.display()))
}

fn parse_ldd(ldd: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in ldd.lines() {
        let resolved = line.split_once("=>").map_or(line, |(_, r)| r).trim();
        if resolved.starts_with("not found") {
            bail!("missing shared library: {}", line.trim());
        }
        if let Some(path) = resolved
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// Copies the host file `path` (symlinks followed) to the same absolute path
/// under `staging`.
fn stage_file(staging: &Path, path: &Path) -> Result<()> {
    let relative = path
        .strip_prefix("/")
        .with_context(|| format!("{} is not an absolute path", path.display()))?;
    let dest = staging.join(relative);
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    // A busybox applet's link of the same name goes first: copying through
    // it would overwrite busybox itself.
    if fs::symlink_metadata(&dest).is_ok_and(|m| m.file_type().is_symlink()) {
        fs::remove_file(&dest).with_context(|| format!("cannot remove {}", dest.display()))?;
    }
    fs::copy(path, &dest)
        .with_context(|| format!("cannot copy {} to {}", path.display(), dest.display()))?;
    Ok(())
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

/// Packs `staging` with `cpio -o -H newc`, every entry owned by root.
fn pack_cpio(staging: &Path, out: &Path) -> Result<()> {
    let mut entries = Vec::new();
    list_tree(staging, Path::new("."), &mut entries)?;
    let list: String = entries
        .iter()
        .map(|e| format!("{}\n", e.display()))
        .collect();

    let file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut child = Command::new("cpio")
        .args(["-o", "-H", "newc", "-R", "0:0", "--quiet"])
        .current_dir(staging)
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .context("cannot start cpio (package cpio, installed by `cargo xtask setup`)")?;
    child
        .stdin
        .take()
        .context("cpio has no stdin")?
        .write_all(list.as_bytes())
        .context("cannot write cpio's file list")?;
    let status = child.wait().context("cannot wait for cpio")?;
    if !status.success() {
        bail!("cpio failed packing {}: {status}", staging.display());
    }
    Ok(())
}

/// Every path under `base/rel`, parents before children, symlinks not followed.
fn list_tree(base: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    out.push(rel.to_path_buf());
    let full = base.join(rel);
    let meta =
        fs::symlink_metadata(&full).with_context(|| format!("cannot stat {}", full.display()))?;
    if meta.is_dir() {
        for name in read_dir_names(&full)? {
            list_tree(base, &rel.join(name), out)?;
        }
    }
    Ok(())
}

/// `/init`: mounts what eBPF needs, runs every case between markers, powers
/// off. Its first commands run with no console until devtmpfs is mounted.
fn init_script(test: &Path, selfheal: Option<&Path>, filter: &str) -> String {
    let mut s = String::from(
        r#"#!/bin/sh
# Generated by `cargo xtask vm-test` (xtask/src/vm.rs).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tracefs tracefs /sys/kernel/tracing || echo "SELFHEAL-VM-WARN no tracefs"
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
# A tmpfs on /tmp, unless a staged binary lives there (it would be hidden).
[ -z "$(ls -A /tmp)" ] && mount -t tmpfs tmpfs /tmp
ip link set lo up
for m in /modules/*.ko; do insmod "$m" || echo "SELFHEAL-VM-WARN cannot load $m"; done
cd /tmp
export HOME=/root TMPDIR=/tmp
# /proc/uptime in centiseconds, and centiseconds as seconds.
now() { read -r up _ </proc/uptime; echo "${up%.*}${up#*.}"; }
secs() { printf '%d.%02d' $(($1 / 100)) $(($1 % 100)); }
has() { if [ -e "$1" ]; then echo yes; else echo no; fi; }
"#,
    );
    s += &format!(
        "echo \"{INIT_MARKER} uptime=$(secs $(now)) kernel=$(uname -r) uid=$(id -u) \
         btf=$(has /sys/kernel/btf/vmlinux) syscall_events=$(has /sys/kernel/tracing/events/syscalls) \
         kprobe_pmu=$(has /sys/bus/event_source/devices/kprobe)\"\n"
    );
    s += &format!(
        r#"run_case() {{
    name=$1; shift
    echo "{CASE_MARKER} $name BEGIN"
    start=$(now)
    "$@"
    rc=$?
    echo "{CASE_MARKER} $name END rc=$rc secs=$(secs $(($(now) - start)))"
}}
"#
    );
    for case in CASES {
        let bin = selfheal.map(|b| ("SELFHEAL_TEST_BIN", b.to_string_lossy().into_owned()));
        let env = COMMON_ENV
            .iter()
            .chain(case.env)
            .map(|(k, v)| (*k, (*v).to_owned()))
            .chain(bin)
            .map(|(k, v)| format!("{k}={}", sh_quote(&v)));
        let cmd: Vec<String> = std::iter::once("env".to_owned())
            .chain(env)
            .chain([
                sh_quote(&test.to_string_lossy()),
                sh_quote(case.filter.unwrap_or(filter)),
            ])
            .chain(["--test-threads=1".to_owned(), "--nocapture".to_owned()])
            .collect();
        s += case.before;
        s += &format!("run_case {} {}\n", sh_quote(case.name), cmd.join(" "));
    }
    s += &format!("echo \"{DONE_MARKER} uptime=$(secs $(now))\"\npoweroff -f\n");
    s
}

/// `s` as one single-quoted shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

// ---------------------------------------------------------------------------
// Booting

struct Boot {
    /// The serial console, line by line.
    lines: Vec<String>,
    /// Wall time from starting qemu to its exit (or to the kill).
    wall: Duration,
    timed_out: bool,
    status: ExitStatus,
}

impl Boot {
    /// `/init` got to the end of its cases.
    fn powered_off(&self) -> bool {
        self.lines.iter().any(|l| l.contains(DONE_MARKER))
    }
    fn panicked(&self) -> bool {
        self.lines.iter().any(|l| l.contains("Kernel panic"))
    }
}

/// Boots `kernel` + `initrd` under qemu TCG, streaming the console to the
/// terminal and `log`, killing qemu once `timeout` has passed.
fn boot(kernel: &Path, initrd: &Path, log: &Path, timeout: Duration) -> Result<Boot> {
    let mut log_file =
        File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = Command::new(QEMU);
    cmd.args(QEMU_ARGS)
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", KERNEL_CMDLINE])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!(
        "vm-test: booting ({QEMU}, TCG; timeout {} s; console also in {})",
        timeout.as_secs(),
        log.display()
    );
    let started = Instant::now();
    let deadline = started + timeout;
    let mut child = cmd.spawn().with_context(|| {
        format!("cannot start {QEMU} (package qemu-system-x86, installed by `cargo xtask setup`)")
    })?;
    let stdout = child.stdout.take().context("qemu has no stdout")?;

    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut buf = Vec::new();
        // Ends at qemu's EOF (its exit or kill), or when the receiver is gone.
        while matches!(stdout.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_owned();
            buf.clear();
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut lines = Vec::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        match rx.recv_timeout(left) {
            Ok(line) => {
                println!("vm| {line}");
                writeln!(log_file, "{line}")
                    .with_context(|| format!("cannot write {}", log.display()))?;
                lines.push(line);
            }
            Err(RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let (status, killed) = wait_or_kill(&mut child, deadline)?;
    timed_out |= killed;
    drop(rx);
    // The reader ends: qemu is gone, so its stdout is at EOF.
    let _ = reader.join();
    Ok(Boot {
        lines,
        wall: started.elapsed(),
        timed_out,
        status,
    })
}

/// Waits for `child` until `deadline`, then kills it; true if it had to.
fn wait_or_kill(child: &mut Child, deadline: Instant) -> Result<(ExitStatus, bool)> {
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for qemu")? {
            return Ok((status, false));
        }
        if Instant::now() >= deadline {
            eprintln!("vm-test: timed out; killing qemu (pid {})", child.id());
            child.kill().context("cannot kill qemu")?;
            return Ok((child.wait().context("cannot wait for killed qemu")?, true));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------
// Judging

#[derive(Debug, PartialEq)]
enum Outcome {
    Passed {
        secs: String,
    },
    Failed {
        rc: String,
        secs: String,
    },
    /// Exit 0, but the name filter matched no test.
    NoTests {
        secs: String,
    },
    /// BEGIN without END: the kernel died or the run timed out mid-case.
    Unfinished,
    /// Never started: the boot failed before it.
    Missing,
}

impl Outcome {
    fn passed(&self) -> bool {
        matches!(self, Outcome::Passed { .. })
    }
    fn secs(&self) -> &str {
        match self {
            Outcome::Passed { secs } | Outcome::Failed { secs, .. } | Outcome::NoTests { secs } => {
                secs
            }
            Outcome::Unfinished | Outcome::Missing => "-",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Passed { .. } => f.write_str("pass"),
            Outcome::Failed { rc, .. } => write!(f, "FAIL: exit code {rc}"),
            Outcome::NoTests { .. } => f.write_str("FAIL: no test matched the filter"),
            Outcome::Unfinished => f.write_str("FAIL: no END marker (panic, hang or timeout)"),
            Outcome::Missing => f.write_str("FAIL: never started"),
        }
    }
}

/// Each case of [`CASES`] with its outcome, read from the console markers.
fn case_outcomes(lines: &[String]) -> Vec<(&'static str, Outcome)> {
    let mut outcomes: Vec<(&'static str, Outcome)> =
        CASES.iter().map(|c| (c.name, Outcome::Missing)).collect();
    let mut current: Option<usize> = None;
    let mut saw_no_tests = false;
    for line in lines {
        let Some(marker) = parse_case_marker(line) else {
            saw_no_tests |= current.is_some() && line.contains(NO_TESTS_LINE);
            continue;
        };
        let Some(i) = outcomes.iter().position(|(n, _)| *n == marker.name) else {
            continue;
        };
        match marker.end {
            None => {
                outcomes[i].1 = Outcome::Unfinished;
                current = Some(i);
                saw_no_tests = false;
            }
            Some((rc, secs)) => {
                outcomes[i].1 = match rc.as_str() {
                    "0" if saw_no_tests => Outcome::NoTests { secs },
                    "0" => Outcome::Passed { secs },
                    _ => Outcome::Failed { rc, secs },
                };
                current = None;
            }
        }
    }
    outcomes
}

struct CaseMarker<'a> {
    name: &'a str,
    /// `None` for BEGIN; `(rc, secs)` for END.
    end: Option<(String, String)>,
}

/// `… SELFHEAL-VM-CASE <name> BEGIN` or `… <name> END rc=<rc> secs=<secs>`,
/// wherever on the line (kernel messages may share it).
fn parse_case_marker(line: &str) -> Option<CaseMarker<'_>> {
    let (_, rest) = line.split_once(CASE_MARKER)?;
    let mut words = rest.split_whitespace();
    let name = words.next()?;
    match words.next()? {
        "BEGIN" => Some(CaseMarker { name, end: None }),
        "END" => {
            let rc = words.next()?.strip_prefix("rc=")?.to_owned();
            let secs = words.next()?.strip_prefix("secs=")?.to_owned();
            Some(CaseMarker {
                name,
                end: Some((rc, secs)),
            })
        }
        _ => None,
    }
}

/// The value of `key=` on the first line carrying `marker`.
fn marker_field<'a>(lines: &'a [String], marker: &str, key: &str) -> Option<&'a str> {
    let line = lines
        .iter()
        .find_map(|l| l.split_once(marker).map(|(_, rest)| rest))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn print_summary(kernel: &Kernel, boot: &Boot, outcomes: &[(&str, Outcome)], log: &Path) {
    println!();
    println!(
        "vm-test summary: {} {} under qemu TCG",
        kernel.package, kernel.version
    );
    println!("  {:<10} {:<46} {:>10}", "case", "result", "test secs");
    for (name, outcome) in outcomes {
        println!(
            "  {:<10} {:<46} {:>10}",
            name,
            outcome.to_string(),
            outcome.secs()
        );
    }
    let guest = |marker, key| marker_field(&boot.lines, marker, key).unwrap_or("?");
    let end = if boot.powered_off() {
        "poweroff"
    } else {
        "qemu exit"
    };
    println!(
        "  boot to {end}: {:.1} s wall (guest uptime: /init at {} s, poweroff at {} s); qemu {}",
        boot.wall.as_secs_f64(),
        guest(INIT_MARKER, "uptime"),
        guest(DONE_MARKER, "uptime"),
        boot.status,
    );
    println!("  serial console: {}", log.display());
}

fn verdict(boot: &Boot, outcomes: &[(&str, Outcome)], filter: &str, log: &Path) -> Result<()> {
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| !o.passed())
        .map(|(name, o)| match o {
            Outcome::NoTests { .. } => {
                let filter = CASES
                    .iter()
                    .find(|c| c.name == *name)
                    .and_then(|c| c.filter)
                    .unwrap_or(filter);
                format!("{name} (no test matched filter {filter:?})")
            }
            o => format!("{name} ({})", o.to_string().trim_start_matches("FAIL: ")),
        })
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let why = if boot.timed_out {
        "; the VM timed out"
    } else if boot.panicked() {
        "; the kernel panicked"
    } else {
        ""
    };
    bail!(
        "vm-test failed: {}{why}; see {}",
        failed.join(", "),
        log.display()
    )
}

// ---------------------------------------------------------------------------
// Process and file helpers

fn run_in(dir: &Path, cmd: &mut Command) -> Result<()> {
    run(cmd.current_dir(dir))
}

/// Runs `cmd` and returns its stdout; stderr goes to the terminal unless the
/// caller redirected it.
fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdout(Stdio::piped())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{cmd:?} printed non-UTF-8 output"))
}

/// The entry names of `dir`, sorted.
fn read_dir_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_versioned_image() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n";
        assert_eq!(
            versioned_image(out).as_deref(),
            Some("linux-image-6.1.0-57-amd64")
        );
        assert_eq!(
            versioned_image("linux-image-amd64\n  Depends: kmod\n"),
            None
        );
    }

    #[test]
    fn reads_the_deb_version() {
        let deb = Path::new("/c/linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb");
        assert_eq!(deb_version(deb).unwrap(), "6.1.192-3");
        assert_eq!(
            deb_version(Path::new("/c/p_1%3a2.0-1_all.deb")).unwrap(),
            "1:2.0-1"
        );
        assert!(deb_version(Path::new("/c/odd.deb")).is_err());
    }

    #[test]
    fn parses_ldd() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        let libs = parse_ldd(out).unwrap();
        assert_eq!(
            libs,
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        assert!(parse_ldd("\tlibfoo.so => not found\n").is_err());
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn judges_cases_from_markers() {
        let lines: Vec<String> = [
            "SELFHEAL-VM-CASE kprobe BEGIN",
            "running 1 test",
            "[   3.2] some kernel noise SELFHEAL-VM-CASE kprobe END rc=0 secs=1.25",
            "SELFHEAL-VM-CASE fentry BEGIN",
            "running 0 tests",
            "SELFHEAL-VM-CASE fentry END rc=0 secs=0.10",
        ]
        .map(String::from)
        .to_vec();
        let outcomes = case_outcomes(&lines);
        assert_eq!(
            outcomes[0],
            (
                "kprobe",
                Outcome::Passed {
                    secs: "1.25".into()
                }
            )
        );
        assert_eq!(
            outcomes[1],
            (
                "fentry",
                Outcome::NoTests {
                    secs: "0.10".into()
                }
            )
        );

        let crashed = case_outcomes(&["SELFHEAL-VM-CASE kprobe BEGIN".to_owned()]);
        assert_eq!(crashed[0].1, Outcome::Unfinished);
        assert_eq!(crashed[1].1, Outcome::Missing);
    }

    #[test]
    fn cli_defaults_match_default() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: VmArgs,
        }
        let cli = <Cli as clap::Parser>::parse_from(["vm-test"]).args;
        let default = VmArgs::default();
        assert_eq!(cli.package(), default.package());
        assert_eq!(cli.test_target(), default.test_target());
        assert_eq!(cli.filter(), default.filter());
        assert_eq!(cli.timeout(), default.timeout());
        assert_eq!(cli.test_exe, default.test_exe);
    }

    #[test]
    fn reads_marker_fields() {
        let lines = vec!["SELFHEAL-VM-INIT uptime=2.50 kernel=6.1.0".to_owned()];
        assert_eq!(marker_field(&lines, INIT_MARKER, "uptime"), Some("2.50"));
        assert_eq!(marker_field(&lines, DONE_MARKER, "uptime"), None);
    }
}
