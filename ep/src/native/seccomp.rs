//! The seccomp filter of native guests: a classic BPF program, the `struct sock_filter` records
//! that bubblewrap's `--seccomp FD` reads (8 bytes each, native endianness, as libseccomp's
//! `seccomp_export_bpf` writes them), which the kernel then runs on every system call of the
//! guest and of the sandbox's init.
//!
//! **What it does.** A call from another architecture than the EP's own (i386 through
//! `int 0x80` on x86_64, or x32 there; 32-bit arm on aarch64) kills the process: its numbers
//! mean other calls, so the table below would not apply. Then the calls in [`DENIED`] fail with
//! `EPERM`, `clone` asking for a new namespace fails with `EPERM`, `clone3` fails with `ENOSYS`
//! (its flags lie in memory a filter cannot read; the C library then falls back to `clone`,
//! which is checked, as under Docker and Podman), and `personality` may only query or set the
//! plain Linux domain. Everything else is allowed: the namespaces, the read-only root, the
//! dropped identity and the control group are the confinement; this list removes the kernel
//! interfaces a batch job never needs and that are most often the way out of a sandbox.
//!
//! The program is data ([`DENIED`], `rules`) and a small builder (`instructions`); the
//! tests run it through an interpreter for every rule and through the kernel for a few.
//!
//! Must not know: jobs, the link, the network, bubblewrap (the runner hands it the program).

use libc::c_long;

/// The architecture the kernel reports for this build's native calls, `AUDIT_ARCH_X86_64`:
/// the ELF machine, 64-bit, little-endian (`<linux/audit.h>`).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = AUDIT_ARCH_64BIT | AUDIT_ARCH_LE | libc::EM_X86_64 as u32;
/// `AUDIT_ARCH_AARCH64`, likewise.
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = AUDIT_ARCH_64BIT | AUDIT_ARCH_LE | libc::EM_AARCH64 as u32;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the native guests' seccomp filter knows x86_64 and aarch64 only");

const AUDIT_ARCH_64BIT: u32 = 0x8000_0000;
const AUDIT_ARCH_LE: u32 = 0x4000_0000;
/// On x86_64, the bit that marks an x32 call (same architecture, other numbers).
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `open_tree_attr` (Linux 6.15; the number is the same on every architecture since 5.1's
/// unified table), not yet in `libc`.
const SYS_OPEN_TREE_ATTR: c_long = 467;

/// `personality` values a program may set or ask for: `PER_LINUX` and the query.
const PER_LINUX: u32 = 0;
const PER_QUERY: u32 = 0xffff_ffff;

/// Every `CLONE_NEW*` flag: a new namespace of any kind.
const CLONE_NEW_ANY: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWTIME) as u32;

/// Reading or steering another process: a debugger's calls. A job computes on its own input;
/// a tracer can rewrite a traced process's calls after the filter ran, and read or write its
/// memory.
const OTHER_PROCESSES: &[c_long] = &[libc::SYS_ptrace, libc::SYS_process_vm_readv, libc::SYS_process_vm_writev];

/// Reshaping the file tree. Bubblewrap builds it before the command starts; a job reads
/// `/input`, writes `/output` and `/tmp`. Mounting in a user namespace reaches file system
/// parsers that are a steady source of privilege escalations.
const MOUNTS: &[c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    SYS_OPEN_TREE_ATTR,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
];

/// New namespaces, or entering others: the sandbox's namespaces are bubblewrap's. A new user
/// namespace makes the job root in it, which opens kernel code otherwise only root reaches.
/// (`clone` and `clone3` are rules of their own: they also make plain processes and threads.)
const NAMESPACES: &[c_long] = &[libc::SYS_unshare, libc::SYS_setns];

/// The kernel's keyrings are not namespaced: a job would share them with every process of
/// its uid on the host, and they have had their share of bugs.
const KEYRINGS: &[c_long] = &[libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key];

/// Code run inside the kernel or a new kernel: eBPF programs, performance monitoring (which
/// also observes the rest of the machine), modules, kexec.
const KERNEL_CODE: &[c_long] = &[
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
];

/// Administering the host: rebooting, swap, process accounting, disk quotas, the kernel log,
/// the terminal, oprofile's `lookup_dcookie`.
const HOST_ADMIN: &[c_long] = &[
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_lookup_dcookie,
];

/// Setting or steering the clock, which is the host's (time namespaces only offset the
/// monotonic clocks). Reading it (`clock_gettime`, `gettimeofday`) stays allowed.
const CLOCK: &[c_long] =
    &[libc::SYS_settimeofday, libc::SYS_clock_settime, libc::SYS_clock_adjtime, libc::SYS_adjtimex];

/// Stalling the kernel at a chosen page fault (`userfaultfd`, the usual way to widen a race
/// in an exploit), and opening files by inode handle, past the paths and thus past the mounts
/// that hide the host (`open_by_handle_at`, the "shocker" container escape, and its half).
const EXPLOIT_AIDS: &[c_long] = &[libc::SYS_userfaultfd, libc::SYS_open_by_handle_at, libc::SYS_name_to_handle_at];

/// Raw hardware I/O ports (x86 only).
#[cfg(target_arch = "x86_64")]
const PORT_IO: &[c_long] = &[libc::SYS_iopl, libc::SYS_ioperm];
#[cfg(not(target_arch = "x86_64"))]
const PORT_IO: &[c_long] = &[];

/// The calls refused with `EPERM` whatever their arguments, by group.
pub const DENIED: &[&[c_long]] =
    &[OTHER_PROCESSES, MOUNTS, NAMESPACES, KEYRINGS, KERNEL_CODE, HOST_ADMIN, CLOCK, EXPLOIT_AIDS, PORT_IO];

/// What the filter does with one system call (any other is allowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Fails with this errno.
    Refuse { nr: c_long, errno: i32 },
    /// Fails with `EPERM` when the low 32 bits of argument `arg` share a bit with `mask`.
    RefuseFlags { nr: c_long, arg: usize, mask: u32 },
    /// Fails with `EPERM` unless the low 32 bits of argument `arg` are one of `values`.
    AllowOnly { nr: c_long, arg: usize, values: &'static [u32] },
}

/// The rules, in the order the program checks them.
fn rules() -> Vec<Rule> {
    let mut rules: Vec<Rule> =
        DENIED.iter().flat_map(|group| group.iter()).map(|&nr| Rule::Refuse { nr, errno: libc::EPERM }).collect();
    // The flags are an `unsigned long` of which the kernel reads the low 32 bits, where every
    // `CLONE_NEW*` lies.
    rules.push(Rule::RefuseFlags { nr: libc::SYS_clone, arg: 0, mask: CLONE_NEW_ANY });
    rules.push(Rule::Refuse { nr: libc::SYS_clone3, errno: libc::ENOSYS });
    // Other execution domains switch off the guest's own hardening (ADDR_NO_RANDOMIZE,
    // READ_IMPLIES_EXEC); the argument is an `unsigned int`.
    rules.push(Rule::AllowOnly { nr: libc::SYS_personality, arg: 0, values: &[PER_LINUX, PER_QUERY] });
    rules
}

/// One classic BPF instruction, as `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

impl Insn {
    /// The record bubblewrap and the kernel read.
    fn to_ne_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..2].copy_from_slice(&self.code.to_ne_bytes());
        b[2] = self.jt;
        b[3] = self.jf;
        b[4..].copy_from_slice(&self.k.to_ne_bytes());
        b
    }
}

// The few instructions the program uses. Offsets are into `struct seccomp_data`:
// `{ int nr; u32 arch; u64 instruction_pointer; u64 args[6]; }`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const OFFSET_ARGS: u32 = 16;
/// Where the low 32 bits of a 64-bit argument lie.
#[cfg(target_endian = "little")]
const LOW_WORD: u32 = 0;
#[cfg(target_endian = "big")]
const LOW_WORD: u32 = 4;

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

fn load(offset: u32) -> Insn {
    Insn { code: LD_W_ABS, jt: 0, jf: 0, k: offset }
}
fn load_arg_low(arg: usize) -> Insn {
    let arg = u32::try_from(arg).expect("six arguments");
    load(OFFSET_ARGS + 8 * arg + LOW_WORD)
}
/// Skips `jt` instructions when the accumulator equals `k`, else `jf`.
fn jeq(k: u32, jt: usize, jf: usize) -> Insn {
    Insn { code: JEQ_K, jt: skip(jt), jf: skip(jf), k }
}
/// Skips `jt` instructions when the accumulator shares a bit with `k`, else `jf`.
fn jset(k: u32, jt: usize, jf: usize) -> Insn {
    Insn { code: JSET_K, jt: skip(jt), jf: skip(jf), k }
}
fn ret(k: u32) -> Insn {
    Insn { code: RET_K, jt: 0, jf: 0, k }
}
fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (u32::try_from(e).expect("an errno") & libc::SECCOMP_RET_DATA)
}
fn skip(n: usize) -> u8 {
    u8::try_from(n).expect("each rule jumps within itself")
}
fn nr(nr: c_long) -> u32 {
    u32::try_from(nr).expect("system call numbers are small")
}

/// The program: check the architecture, then each rule; allow the rest.
fn instructions() -> Vec<Insn> {
    let mut p = vec![load(OFFSET_ARCH), jeq(AUDIT_ARCH, 1, 0), ret(KILL), load(OFFSET_NR)];
    // x32 calls carry x86_64's architecture and other numbers; -1 has the bit too, and
    // nothing a job runs makes that call.
    #[cfg(target_arch = "x86_64")]
    p.extend([jset(X32_SYSCALL_BIT, 0, 1), ret(KILL)]);
    for rule in rules() {
        // Each rule starts with the call's number in the accumulator and either falls through
        // to the next rule with it still there, or returns.
        match rule {
            Rule::Refuse { nr: n, errno: e } => p.extend([jeq(nr(n), 0, 1), ret(errno(e))]),
            Rule::RefuseFlags { nr: n, arg, mask } => {
                p.extend([jeq(nr(n), 0, 4), load_arg_low(arg), jset(mask, 0, 1), ret(errno(libc::EPERM)), ret(ALLOW)])
            }
            Rule::AllowOnly { nr: n, arg, values } => {
                p.extend([jeq(nr(n), 0, values.len() + 3), load_arg_low(arg)]);
                for (i, &v) in values.iter().enumerate() {
                    p.push(jeq(v, values.len() - i, 0));
                }
                p.extend([ret(errno(libc::EPERM)), ret(ALLOW)]);
            }
        }
    }
    p.push(ret(ALLOW));
    p
}

/// The program as bubblewrap's `--seccomp FD` reads it.
pub fn program() -> Vec<u8> {
    instructions().into_iter().flat_map(Insn::to_ne_bytes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct seccomp_data`, as far as the program reads it.
    struct Call {
        nr: i32,
        arch: u32,
        args: [u64; 6],
    }

    impl Call {
        fn native(nr: c_long, args: [u64; 6]) -> Call {
            Call { nr: i32::try_from(nr).expect("a call number"), arch: AUDIT_ARCH, args }
        }

        fn word(&self, offset: u32) -> u32 {
            let mut data = [0u8; 64];
            data[..4].copy_from_slice(&self.nr.to_ne_bytes());
            data[4..8].copy_from_slice(&self.arch.to_ne_bytes());
            for (i, a) in self.args.iter().enumerate() {
                data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
            }
            let at = usize::try_from(offset).expect("an offset");
            u32::from_ne_bytes(data[at..at + 4].try_into().expect("four bytes"))
        }
    }

    /// What the kernel would do with `call`: classic BPF, the instructions the builder emits.
    fn verdict(call: &Call) -> u32 {
        let program = instructions();
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = program[pc];
            let taken = match i.code {
                LD_W_ABS => {
                    a = call.word(i.k);
                    pc += 1;
                    continue;
                }
                RET_K => return i.k,
                JEQ_K => a == i.k,
                JSET_K => a & i.k != 0,
                other => panic!("an instruction the program never uses: {other:#x}"),
            };
            pc += 1 + usize::from(if taken { i.jt } else { i.jf });
        }
    }

    fn args0(a: u64) -> [u64; 6] {
        [a, 0, 0, 0, 0, 0]
    }

    #[test]
    fn every_denied_call_fails_with_eperm() {
        for &nr in DENIED.iter().flat_map(|g| g.iter()) {
            assert_eq!(verdict(&Call::native(nr, [0; 6])), errno(libc::EPERM), "call {nr}");
            assert_eq!(verdict(&Call::native(nr, [u64::MAX; 6])), errno(libc::EPERM), "call {nr}");
        }
        for nr in [libc::SYS_ptrace, libc::SYS_mount, libc::SYS_unshare, libc::SYS_keyctl, libc::SYS_bpf] {
            assert!(DENIED.iter().any(|g| g.contains(&nr)), "call {nr}");
        }
    }

    #[test]
    fn everyday_calls_are_allowed() {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut everyday = vec![
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_close,
            libc::SYS_mmap,
            libc::SYS_mprotect,
            libc::SYS_brk,
            libc::SYS_futex,
            libc::SYS_execve,
            libc::SYS_wait4,
            libc::SYS_exit_group,
            libc::SYS_getpid,
            libc::SYS_clock_gettime,
            libc::SYS_socket,
            libc::SYS_prctl,
        ];
        #[cfg(target_arch = "x86_64")]
        everyday.extend([libc::SYS_fork, libc::SYS_vfork, libc::SYS_arch_prctl, libc::SYS_gettimeofday]);
        for nr in everyday {
            assert_eq!(verdict(&Call::native(nr, [0; 6])), ALLOW, "call {nr}");
        }
    }

    #[test]
    fn a_foreign_architecture_is_killed() {
        // AUDIT_ARCH_I386 (int 0x80 on x86_64), AUDIT_ARCH_ARM (aarch64's 32-bit mode), none.
        for arch in [0x4000_0003, 0x4000_0028, 0] {
            let call = Call { nr: 39, arch, args: [0; 6] };
            assert_eq!(verdict(&call), KILL, "arch {arch:#x}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn an_x32_call_is_killed() {
        let getpid = Call::native(libc::SYS_getpid | c_long::from(X32_SYSCALL_BIT.cast_signed()), [0; 6]);
        assert_eq!(verdict(&getpid), KILL);
        assert_eq!(verdict(&Call { nr: -1, arch: AUDIT_ARCH, args: [0; 6] }), KILL);
    }

    #[test]
    fn clone_may_not_make_a_namespace() {
        for bit in 0..32 {
            let flag = 1u32 << bit;
            if CLONE_NEW_ANY & flag != 0 {
                let flags = u64::from(flag) | u64::from(libc::SIGCHLD.cast_unsigned());
                assert_eq!(verdict(&Call::native(libc::SYS_clone, args0(flags))), errno(libc::EPERM), "{flag:#x}");
            }
        }
        assert_eq!(CLONE_NEW_ANY.count_ones(), 8);
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID)
            .cast_unsigned();
        let fork = libc::SIGCHLD.cast_unsigned();
        for flags in [u64::from(thread), u64::from(fork), (1 << 32) | u64::from(fork)] {
            assert_eq!(verdict(&Call::native(libc::SYS_clone, args0(flags))), ALLOW, "{flags:#x}");
        }
        assert_eq!(verdict(&Call::native(libc::SYS_clone3, [0; 6])), errno(libc::ENOSYS));
    }

    #[test]
    fn personality_may_only_query_or_set_linux() {
        for allowed in [0, 0xffff_ffff, 0xffff_ffff_ffff_ffff] {
            assert_eq!(verdict(&Call::native(libc::SYS_personality, args0(allowed))), ALLOW, "{allowed:#x}");
        }
        // PER_LINUX32, ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC.
        for refused in [0x0008, 0x0004_0000, 0x0040_0000] {
            assert_eq!(verdict(&Call::native(libc::SYS_personality, args0(refused))), errno(libc::EPERM));
        }
    }

    /// Whole 8-byte records, well under the kernel's 4096 instructions and one pipe page; every
    /// jump lands inside and the last instruction returns.
    #[test]
    fn the_program_is_well_formed() {
        let insns = instructions();
        let bytes = program();
        assert_eq!(bytes.len(), 8 * insns.len());
        assert!(bytes.len() < 4096, "{}", bytes.len());
        assert_eq!(bytes[..8], load(OFFSET_ARCH).to_ne_bytes());
        assert_eq!(u16::from_ne_bytes([bytes[0], bytes[1]]), LD_W_ABS);
        assert_eq!(u32::from_ne_bytes(bytes[4..8].try_into().expect("four")), OFFSET_ARCH);
        for (pc, i) in insns.iter().enumerate() {
            if i.code == JEQ_K || i.code == JSET_K {
                assert!(pc + 1 + usize::from(i.jt.max(i.jf)) < insns.len(), "jump at {pc}");
            }
        }
        assert_eq!(insns.last().map(|i| i.code), Some(RET_K));
    }

    /// How a probed call ended in a child process under a filter.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Probe {
        Returned,
        Failed(i32),
        Killed(i32),
    }

    /// The child's exit codes besides an errno.
    const RETURNED: i32 = 200;
    const NOT_INSTALLED: i32 = 201;

    /// Forks a child that installs `filter` (if any), makes call `nr` and exits with the result.
    #[allow(unsafe_code)]
    fn probe(filter: Option<&[libc::sock_filter]>, nr: c_long, args: [u64; 6]) -> Probe {
        let fprog = filter.map(|f| libc::sock_fprog {
            len: u16::try_from(f.len()).expect("a short program"),
            filter: f.as_ptr().cast_mut(),
        });
        // SAFETY: the child runs `filtered_call` only, which is fit for the fork of a
        // multi-threaded process (see there).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            filtered_call(fprog.as_ref(), nr, args);
        }
        assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
        let status = wait(pid);
        if libc::WIFSIGNALED(status) {
            return Probe::Killed(libc::WTERMSIG(status));
        }
        match libc::WEXITSTATUS(status) {
            RETURNED => Probe::Returned,
            NOT_INSTALLED => panic!("the filter could not be installed"),
            e => Probe::Failed(e),
        }
    }

    /// In a forked child: installs `fprog` (if any), makes call `nr`, and exits with
    /// [`RETURNED`] or the call's errno.
    #[allow(unsafe_code)]
    fn filtered_call(fprog: Option<&libc::sock_fprog>, nr: c_long, args: [u64; 6]) -> ! {
        // SAFETY: system calls only (prctl, the probed call, _exit): async-signal-safe, no lock
        // taken nor memory allocated, as the fork of a multi-threaded process requires; `fprog`
        // points at a filter in this process's copy of the memory; the probed calls' pointer
        // arguments are null or point at static bytes, and the kernel checks them.
        unsafe {
            let installed = fprog.is_none_or(|fprog| {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1u64, 0u64, 0u64, 0u64) == 0
                    && libc::prctl(
                        libc::PR_SET_SECCOMP,
                        u64::from(libc::SECCOMP_MODE_FILTER),
                        std::ptr::from_ref(fprog),
                    ) == 0
            });
            if !installed {
                libc::_exit(NOT_INSTALLED);
            }
            let r = libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]);
            libc::_exit(if r < 0 { *libc::__errno_location() } else { RETURNED });
        }
    }

    /// The wait status of child `pid`, once it ended.
    #[allow(unsafe_code)]
    fn wait(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child; `status` is a valid place to write.
            if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
                return status;
            }
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "waitpid: {e}");
        }
    }

    /// The kernel loads the program and answers as the rules say: refused calls fail with
    /// `EPERM` (`clone3` with `ENOSYS`, which without the filter it would not), x32 calls kill,
    /// everyday calls and a plain fork run.
    #[test]
    fn the_kernel_applies_the_filter() {
        let filter: Vec<libc::sock_filter> =
            instructions().iter().map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect();
        let root = c"/".as_ptr() as u64;
        let empty = c"".as_ptr() as u64;
        let sigchld = u64::from(libc::SIGCHLD.cast_unsigned());
        let flag = |f: i32| u64::from(f.cast_unsigned());
        let eperm = Probe::Failed(libc::EPERM);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut cases = vec![
            ("getpid", libc::SYS_getpid, [0; 6], Probe::Returned),
            ("write", libc::SYS_write, [2, empty, 0, 0, 0, 0], Probe::Returned),
            ("openat", libc::SYS_openat, [flag(libc::AT_FDCWD), root, flag(libc::O_RDONLY), 0, 0, 0], Probe::Returned),
            ("fork", libc::SYS_clone, args0(sigchld), Probe::Returned),
            ("personality query", libc::SYS_personality, args0(0xffff_ffff), Probe::Returned),
            ("keyctl", libc::SYS_keyctl, [0; 6], eperm),
            ("bpf", libc::SYS_bpf, [0; 6], eperm),
            ("ptrace traceme", libc::SYS_ptrace, [0; 6], eperm),
            ("mount", libc::SYS_mount, [0; 6], eperm),
            ("unshare user", libc::SYS_unshare, args0(flag(libc::CLONE_NEWUSER)), eperm),
            ("clone newnet", libc::SYS_clone, args0(flag(libc::CLONE_NEWNET) | sigchld), eperm),
            ("perf_event_open", libc::SYS_perf_event_open, [0; 6], eperm),
            ("personality linux32", libc::SYS_personality, args0(8), eperm),
            ("clone3", libc::SYS_clone3, [0; 6], Probe::Failed(libc::ENOSYS)),
        ];
        #[cfg(target_arch = "x86_64")]
        cases.push((
            "x32 getpid",
            libc::SYS_getpid | c_long::from(X32_SYSCALL_BIT.cast_signed()),
            [0; 6],
            Probe::Killed(libc::SIGSYS),
        ));
        for (name, nr, args, expected) in cases {
            assert_eq!(probe(Some(&filter), nr, args), expected, "{name}");
        }
        let unfiltered = probe(None, libc::SYS_clone3, [0; 6]);
        assert!(matches!(unfiltered, Probe::Failed(e) if e != libc::ENOSYS), "{unfiltered:?}");
    }
}
