//! The judge image's class-data-sharing (CDS) archives for Java.
//!
//! A JVM spends most of its start loading and verifying classes. The JDK
//! ships an archive of the few hundred classes a hello-world loads, but
//! javac loads over a thousand more (the compiler itself), and judge
//! programs load `Scanner`, collections and the regex engine. The judge
//! image carries two archives made by its own JDK when it is built:
//! [`JAVAC_CDS_ARCHIVE`], a dynamic archive of what javac loads (a cold
//! FnCall Java compile took 0.64 s instead of 0.41 s without it on this
//! project's test machine), and [`JAVA_CDS_ARCHIVE`], a static one of the
//! classes a typical judge program loads (0.092 instead of 0.102 s per
//! run). FnCall passes them only when they exist; their paths and javac's
//! JVM options ([`JAVAC_JVM_FLAGS`], which javac's archive is made under)
//! come from the runners' language table in dsec-fncall-runner. The build
//! checks that each JVM maps its archive (`-Xshare:on` fails otherwise).

use std::fs;
use std::path::Path;
use std::process::Command;

use dsec_fncall_runner::{JAVAC_CDS_ARCHIVE, JAVAC_JVM_FLAGS, JAVA_CDS_ARCHIVE};

use super::tool::{self, UNSHARE};
use super::{io_err, BuildError};
use crate::progress::Progress;

/// Scratch space inside the image's `/tmp`, removed after.
const WORK: &str = "tmp/dsec-java-cds";

/// A program that loads what judge solutions commonly use: the input
/// readers and writers, the collections, sorting with comparators and
/// lambdas, streams, string formatting, big numbers.
const WARM_UP: &str = r#"import java.io.*;
import java.math.BigInteger;
import java.util.*;
import java.util.stream.*;

public class Main {
    public static void main(String[] args) throws IOException {
        BufferedReader br = new BufferedReader(new InputStreamReader(System.in));
        StringTokenizer st = new StringTokenizer(br.readLine());
        int n = Integer.parseInt(st.nextToken());
        long m = Long.parseLong(st.nextToken());
        Scanner sc = new Scanner(br.readLine());
        double d = sc.nextDouble();
        List<Integer> list = new ArrayList<>();
        for (int i = 0; i < n; i++) list.add(i * 7 % 5);
        Collections.sort(list, Comparator.reverseOrder());
        int[] a = list.stream().mapToInt(Integer::intValue).toArray();
        Arrays.sort(a);
        Integer[] boxed = IntStream.of(a).boxed().toArray(Integer[]::new);
        Arrays.sort(boxed, (x, y) -> y - x);
        Map<Integer, Long> counts = list.stream().collect(Collectors.groupingBy(x -> x, TreeMap::new, Collectors.counting()));
        Map<String, Integer> h = new HashMap<>();
        h.merge("k", 1, Integer::sum);
        Set<Integer> s = new HashSet<>(list);
        TreeSet<Integer> ts = new TreeSet<>(list);
        Deque<Integer> dq = new ArrayDeque<>();
        dq.push(1);
        PriorityQueue<long[]> pq = new PriorityQueue<>((x, y) -> Long.compare(x[0], y[0]));
        pq.add(new long[] {m, 1});
        LinkedList<Integer> ll = new LinkedList<>(s);
        StringBuilder sb = new StringBuilder();
        sb.append(counts).append(' ').append(ts.first()).append(dq.pop()).append(pq.poll()[0]).append(ll.size());
        PrintWriter out = new PrintWriter(new BufferedWriter(new OutputStreamWriter(System.out)));
        out.println(sb);
        out.printf("%.3f %s%n", Math.sqrt(d), BigInteger.valueOf(m).pow(3).mod(BigInteger.TEN));
        out.println(String.join(",", "a", "b") + String.format("%5d", n) + h + Arrays.toString(boxed));
        out.flush();
    }
}
"#;

/// Makes both archives in the tree at `root` (which has a JDK) and checks
/// that each is used.
pub(crate) fn archive_java_classes(root: &Path, progress: &dyn Progress) -> Result<(), BuildError> {
    let work = root.join(WORK);
    fs::create_dir_all(&work).map_err(io_err("creating", &work))?;
    let outcome = archive_in(root, &work, progress);
    let removed = fs::remove_dir_all(&work).map_err(io_err("removing", &work));
    outcome.and(removed)
}

fn archive_in(root: &Path, work: &Path, progress: &dyn Progress) -> Result<(), BuildError> {
    for (name, text) in [("Main.java", WARM_UP), ("input.txt", "12 1000000007\n2.25\n")] {
        let path = work.join(name);
        fs::write(&path, text).map_err(io_err("writing", &path))?;
    }
    let dir = root.join(JAVAC_CDS_ARCHIVE.trim_start_matches('/'));
    let dir = dir.parent().expect("an archive path has a directory");
    fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    let javac_flags = JAVAC_JVM_FLAGS.join(" ");
    let w = format!("/{WORK}");
    progress.stage("archiving the classes javac and judge programs load (Java CDS)");
    in_image(root, &format!("javac {javac_flags} -J-XX:ArchiveClassesAtExit={JAVAC_CDS_ARCHIVE} -d {w}/classes {w}/Main.java"))?;
    in_image(root, &format!("java -XX:-UsePerfData -XX:DumpLoadedClassList={w}/classlist -cp {w}/classes Main < {w}/input.txt"))?;
    in_image(
        root,
        &format!("java -XX:-UsePerfData -Xshare:dump -XX:SharedClassListFile={w}/classlist -XX:SharedArchiveFile={JAVA_CDS_ARCHIVE}"),
    )?;
    // -Xshare:on: a JVM that cannot map the archive fails instead of
    // starting without it.
    in_image(root, &format!("javac {javac_flags} -J-Xshare:on -J-XX:SharedArchiveFile={JAVAC_CDS_ARCHIVE} -d {w}/again {w}/Main.java"))?;
    in_image(root, &format!("java -XX:+UseSerialGC -XX:-UsePerfData -Xshare:on -XX:SharedArchiveFile={JAVA_CDS_ARCHIVE} -cp {w}/classes Main < {w}/input.txt"))
        .map(|_| ())
}

/// Runs `script` with `sh` inside `root` (chroot) with `/proc` mounted, as
/// a JVM needs (its launcher finds its libraries through
/// `/proc/self/exe`): in a mount namespace of its own, so that the mount
/// goes with the command, however it ends. A fixed environment; output
/// lines (stdout and stderr).
fn in_image(root: &Path, script: &str) -> Result<Vec<String>, BuildError> {
    let mut cmd = Command::new(UNSHARE.name);
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        "mount -t proc proc \"$0/proc\" && exec chroot \"$0\" sh -c \"$1\"",
    ])
    .arg(root)
    .arg(script);
    cmd.env_clear().env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").env("LC_ALL", "C").env("HOME", "/tmp");
    tool::run(&UNSHARE, cmd, None).map_err(|e| BuildError::JavaCds(format!("`{script}`: {e}")))
}
