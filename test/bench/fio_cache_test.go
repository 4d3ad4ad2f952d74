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
func cacheTest(b *testing.B, fio string, base, vol fioTarget, k fioKnobs) {
	var onPool, inVol []cacheFigures
	for pass := range k.passes {
		run := func(t fioTarget) cacheFigures { return cacheRun(b, fio, t, k.cache) }
		if pass%2 == 0 {
			onPool, inVol = append(onPool, run(base)), append(inVol, run(vol))
		} else {
			inVol, onPool = append(inVol, run(vol)), append(onPool, run(base))
		}
	}
	col := func(f []cacheFigures, get func(cacheFigures) float64) sample {
		v := make([]float64, len(f))
		for i := range f {
			v[i] = get(f[i])
		}
		return summarizeFloats(v)
	}
	mibOf := func(n int64) float64 { return float64(n) / float64(mib) }
	poolFile := col(onPool, func(c cacheFigures) float64 { return mibOf(c.file) })
	image := col(inVol, func(c cacheFigures) float64 { return mibOf(c.image) })
	fmt.Printf("\npage cache during a %d MiB buffered sequential write (1 MiB writes, fsync at the end), maxima sampled every 100 ms, median of %d passes ±spread\n",
		k.cache/mib, k.passes)
	fmt.Printf("| figure | on the pool filesystem | inside the %s | ratio |\n|---|---|---|---|\n", vol.name)
	fmt.Printf("| page cache of the written file (MiB, mincore) | %s | %s | %s |\n", poolFile,
		col(inVol, func(c cacheFigures) float64 { return mibOf(c.file) }), ratioOf(col(inVol, func(c cacheFigures) float64 { return mibOf(c.file) }).median, poolFile.median))
	verdict := "missed"
	if image.median < 0.05*poolFile.median {
		verdict = "met"
	}
	fmt.Printf("| page cache of the image file (MiB, mincore) | — | %s | %s of the pool file's (goal < 5%%: %s) |\n", image,
		pct(image.median, poolFile.median), verdict)
	cachedPool := col(onPool, func(c cacheFigures) float64 { return mibOf(c.cached) })
	cachedVol := col(inVol, func(c cacheFigures) float64 { return mibOf(c.cached) })
	fmt.Printf("| growth of Cached in /proc/meminfo (MiB, all copies) | %s | %s | %s |\n", cachedPool, cachedVol, ratioOf(cachedVol.median, cachedPool.median))
	wPool, wVol := col(onPool, func(c cacheFigures) float64 { return c.mibps }), col(inVol, func(c cacheFigures) float64 { return c.mibps })
	fmt.Printf("| write rate to fsync (MiB/s) | %s | %s | %s |\n", wPool, wVol, ratioOf(wVol.median, wPool.median))
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
