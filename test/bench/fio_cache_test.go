package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cacheFigures are the maxima seen during one buffered sequential write.
type cacheFigures struct {
	// file is the page cache held by the written file itself (the file in
	// the pool, or the file inside the volume).
	file int64
	// image is the page cache held by the volume's image file: the second
	// copy that direct I/O on the loop device avoids.
	image int64
	// cached is the growth of Cached in /proc/meminfo: every copy, whoever
	// holds it (and whatever else the shared host caches meanwhile).
	cached int64
	mibps  float64
}

// cacheTest writes k.cache bytes sequentially with buffered I/O (1 MiB
// writes, fsync at the end), on the pool and inside the volume, alternating
// pass by pass, and samples the page cache every 100 ms.
//
// The image's share is measured with mincore(2) on the image file mapped
// read-only: it counts the pages of that one file, which is the question
// (does the loop device make the image file cache the data a second time?).
// /proc/meminfo's Cached is printed beside it as a cross-check, but alone it
// could not tell the volume's own copy from the image's, and the shared host
// moves it too.
func cacheTest(b *testing.B, fio string, base fioTarget, vols []fioTarget, k fioKnobs) {
	all := append([]fioTarget{base}, vols...)
	figs := make([][]cacheFigures, len(all))
	for pass := range k.passes {
		for i := range all {
			j := (i + pass) % len(all) // rotate, as the fio jobs do
			all[j].apply(b)
			figs[j] = append(figs[j], cacheRun(b, fio, all[j], k.cache))
		}
	}
	col := func(i int, get func(cacheFigures) float64) sample {
		v := make([]float64, len(figs[i]))
		for p := range figs[i] {
			v[p] = get(figs[i][p])
		}
		return summarizeFloats(v)
	}
	mibOf := func(n int64) float64 { return float64(n) / float64(mib) }
	fmt.Printf("\npage cache during a %d MiB buffered sequential write (1 MiB writes, fsync at the end), maxima sampled every 100 ms, median of %d passes ±spread; ratio = volume/pool\n",
		k.cache/mib, k.passes)
	fmt.Printf("| figure | on the pool filesystem")
	for _, v := range vols {
		fmt.Printf(" | inside the %s | ratio", v.name)
	}
	fmt.Printf(" |\n|---|---|")
	for range vols {
		fmt.Printf("---|---|")
	}
	fmt.Printf("\n")
	row := func(name string, get func(cacheFigures) float64, ratio func(v, base float64) string) {
		baseline := col(0, get)
		fmt.Printf("| %s | %s", name, baseline)
		for i := range vols {
			v := col(1+i, get)
			fmt.Printf(" | %s | %s", v, ratio(v.median, baseline.median))
		}
		fmt.Printf(" |\n")
	}
	file := func(c cacheFigures) float64 { return mibOf(c.file) }
	row("page cache of the written file (MiB, mincore)", file, ratioOf)
	// The goal compares the image's cache with what the bare filesystem
	// caches for the same write.
	poolFile := col(0, file).median
	fmt.Printf("| page cache of the image file (MiB, mincore; goal < 5%% of the pool file's) | —")
	for i := range vols {
		img := col(1+i, func(c cacheFigures) float64 { return mibOf(c.image) })
		verdict := "missed"
		if img.median < 0.05*poolFile {
			verdict = "met"
		}
		fmt.Printf(" | %s | %s: %s", img, pct(img.median, poolFile), verdict)
	}
	fmt.Printf(" |\n")
	row("growth of Cached in /proc/meminfo (MiB, all copies)", func(c cacheFigures) float64 { return mibOf(c.cached) }, ratioOf)
	row("write rate up to the fsync (MiB/s)", func(c cacheFigures) float64 { return c.mibps }, ratioOf)
}

func pct(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f%%", 100*a/b)
}

// cacheRun is one buffered write of size bytes into t.dir/cache.bin.
func cacheRun(b *testing.B, fio string, t fioTarget, size int64) cacheFigures {
	b.Helper()
	path := filepath.Join(t.dir, "cache.bin")
	os.Remove(path)
	defer os.Remove(path)
	var imageMap []byte
	if t.image != "" {
		img, err := os.Open(t.image)
		if err != nil {
			b.Fatal(err)
		}
		defer img.Close()
		st, err := img.Stat()
		if err != nil {
			b.Fatal(err)
		}
		if imageMap, err = unix.Mmap(int(img.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED); err != nil {
			b.Fatal(err)
		}
		defer unix.Munmap(imageMap)
	}
	image0 := residentBytes(b, imageMap)
	cached0 := meminfoCached(b)

	var (
		mu   sync.Mutex
		fig  cacheFigures
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	sampleOnce := func() {
		file, image, cached := fileResident(b, path, size), residentBytes(b, imageMap)-image0, meminfoCached(b)-cached0
		mu.Lock()
		fig.file, fig.image, fig.cached = max(fig.file, file), max(fig.image, image), max(fig.cached, cached)
		mu.Unlock()
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				sampleOnce()
			}
		}
	}()
	start := time.Now()
	cmd := exec.Command(fio, "--output-format=json", "--name=cache", "--filename="+path, fmt.Sprintf("--size=%d", size),
		"--rw=write", "--bs=1M", "--ioengine=psync", "--direct=0", "--end_fsync=1", "--fallocate=none")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	elapsed := time.Since(start)
	close(stop)
	<-done
	if err != nil {
		b.Fatalf("fio cache write on %s: %v: %s", t.name, err, stderr.String())
	}
	sampleOnce()
	fig.mibps = float64(size) / float64(mib) / elapsed.Seconds()
	return fig
}

// fileResident is how much of the file at path is in the page cache. The
// file is opened anew each time: fio lays out a file it finds too small by
// unlinking it and creating it again, so a descriptor taken before it runs
// would count the pages of a file nobody writes.
func fileResident(b *testing.B, path string, size int64) int64 {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	// Mapped to the full size, beyond the end while fio writes: mincore
	// needs only the mapping.
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	return residentBytes(b, m)
}

// residentBytes is how much of the mapping is in the page cache, by mincore.
func residentBytes(b *testing.B, m []byte) int64 {
	if len(m) == 0 {
		return 0
	}
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	// x/sys has no Mincore wrapper at the version in go.mod.
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		b.Fatalf("mincore: %v", errno)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * int64(page)
}

// meminfoCached returns Cached of /proc/meminfo in bytes.
func meminfoCached(b *testing.B) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "Cached:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("/proc/meminfo: %q", s.Text())
			}
			return kb << 10
		}
	}
	b.Fatal("/proc/meminfo has no Cached line")
	return 0
}
