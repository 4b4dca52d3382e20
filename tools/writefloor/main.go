//go:build linux

// Command writefloor measures what one write(2) of a small frame to a
// loopback TCP socket costs the writing process, the floor under the
// gateway's CPU per delivery: a writer holds -conns accepted sockets and,
// -rate times per second, writes one -bytes frame to each of them (what
// the node does for one group message to -conns members online), -frames
// frames per write(2); a reader process (this binary, `writefloor read`)
// holds the other ends on an epoll loop and reads everything. The writer's
// CPU time (utime + stime, getrusage) over the sending window, divided by
// the frames, is printed next to the reader's.
//
//	go run ./tools/writefloor -conns 10000 -rate 5 -messages 50
//	go run ./tools/writefloor -conns 10000 -rate 5 -messages 50 -frames 2
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "read" {
		if err := read(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "writefloor read:", err)
			os.Exit(1)
		}
		return
	}
	if err := write(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "writefloor:", err)
		os.Exit(1)
	}
}

func cpu(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func write(args []string) error {
	fs := flag.NewFlagSet("writefloor", flag.ContinueOnError)
	conns := fs.Int("conns", 10000, "sockets")
	rate := fs.Float64("rate", 5, "bursts (one frame to every socket) per second; 0: back to back")
	messages := fs.Int("messages", 50, "bursts")
	size := fs.Int("bytes", 300, "frame size")
	frames := fs.Int("frames", 1, "frames per write(2) (a batch of that many bursts)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runtime.GOMAXPROCS(1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	rd := exec.Command(exe, "read", ln.Addr().String(), strconv.Itoa(*conns))
	rd.Stderr = os.Stderr
	out, err := rd.StdoutPipe()
	if err != nil {
		return err
	}
	in, err := rd.StdinPipe()
	if err != nil {
		return err
	}
	if err := rd.Start(); err != nil {
		return err
	}
	defer rd.Process.Kill()
	fds := make([]int, 0, *conns)
	for len(fds) < *conns {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		fd, err := socketFD(c)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
		defer syscall.Close(fd)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		return errors.New("reader not ready")
	}
	buf := make([]byte, *size**frames)
	for i := range buf {
		buf[i] = 'x'
	}
	bursts := *messages / *frames
	time.Sleep(500 * time.Millisecond)
	c0, t0 := cpu(syscall.RUSAGE_SELF), time.Now()
	var again int
	for b := range bursts {
		if *rate > 0 {
			time.Sleep(time.Until(t0.Add(time.Duration(float64(b**frames) / *rate * float64(time.Second)))))
		}
		for _, fd := range fds {
			if _, err := syscall.Write(fd, buf); err != nil {
				if errors.Is(err, syscall.EAGAIN) {
					again++
					continue
				}
				return err
			}
		}
	}
	c1, el := cpu(syscall.RUSAGE_SELF), time.Since(t0)
	fmt.Fprintln(in, "cpu")
	if !sc.Scan() {
		return errors.New("reader gone")
	}
	readerCPU, _ := time.ParseDuration(strings.TrimSpace(sc.Text()))
	n := bursts * *frames * *conns
	writes := bursts * *conns
	fmt.Printf("%d frames of %d B in %d write(2) calls (%d per call) to %d sockets in %v (EAGAIN %d)\n",
		n, *size, writes, *frames, *conns, el.Round(time.Millisecond), again)
	fmt.Printf("writer CPU: %v per write(2), %v per frame; reader CPU: %v per frame\n",
		(c1-c0)/time.Duration(writes), (c1-c0)/time.Duration(n), readerCPU/time.Duration(n))
	return nil
}

// read connects n sockets to addr, says "ready", reads everything on an
// epoll loop, and answers "cpu" on stdin with its CPU time since ready.
func read(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: read ADDR N")
	}
	n, _ := strconv.Atoi(args[1])
	ep, err := syscall.EpollCreate1(0)
	if err != nil {
		return err
	}
	for i := range n {
		c, err := net.Dial("tcp", args[0])
		if err != nil {
			return err
		}
		fd, err := socketFD(c)
		if err != nil {
			return err
		}
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return err
		}
		_ = i
		defer syscall.Close(fd)
	}
	c0 := cpu(syscall.RUSAGE_SELF)
	fmt.Println("ready")
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			fmt.Println(cpu(syscall.RUSAGE_SELF) - c0)
		}
		os.Exit(0)
	}()
	runtime.LockOSThread()
	evs := make([]syscall.EpollEvent, 256)
	buf := make([]byte, 64<<10)
	for {
		k, err := syscall.EpollWait(ep, evs, 100)
		if err != nil && !errors.Is(err, syscall.EINTR) {
			return err
		}
		for _, e := range evs[:max(k, 0)] {
			_, _ = syscall.Read(int(e.Fd), buf)
		}
	}
}

// socketFD takes c's socket out of the Go runtime: a non-blocking
// descriptor of it that no os.File owns (the caller closes it), for raw
// write(2) and epoll; c is closed.
func socketFD(c net.Conn) (int, error) {
	f, err := c.(*net.TCPConn).File()
	c.Close()
	if err != nil {
		return -1, err
	}
	fd, err := syscall.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return -1, err
	}
	return fd, syscall.SetNonblock(fd, true)
}
