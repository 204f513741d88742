// Command pluginrelease prints the Slurm release a SPANK plugin was built
// for: the plugin_version symbol that SPANK_PLUGIN stamps from the headers'
// SLURM_VERSION_NUMBER, and that slurmd compares with its own release before
// it loads the plugin. With -want RELEASE (as `slurmd -V` prints it,
// "slurm-wlm 24.11.5") it exits 1 unless the plugin's major.minor is that release's.
package main

import (
	"debug/elf"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"strings"
)

func release(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return "", fmt.Errorf("%s: %v", path, err)
	}
	for _, s := range syms {
		if s.Name != "plugin_version" {
			continue
		}
		if s.Size != 4 || int(s.Section) >= len(f.Sections) {
			return "", fmt.Errorf("%s: plugin_version is not a 4-byte datum", path)
		}
		sec := f.Sections[s.Section]
		b := make([]byte, 4)
		if _, err := sec.ReadAt(b, int64(s.Value-sec.Addr)); err != nil {
			return "", fmt.Errorf("%s: reading plugin_version: %v", path, err)
		}
		v := binary.LittleEndian.Uint32(b)
		return fmt.Sprintf("%d.%02d.%d", v>>16&0xff, v>>8&0xff, v&0xff), nil
	}
	return "", fmt.Errorf("%s has no plugin_version symbol: not a SPANK plugin built with SPANK_PLUGIN()", path)
}

func main() {
	want := flag.String("want", "", "the Slurm release the plugin must be built for (`slurmd -V` output)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: pluginrelease [-want 'slurm X.Y.Z'] spank_reft.so")
		os.Exit(2)
	}
	got, err := release(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pluginrelease:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: built for Slurm %s\n", flag.Arg(0), got)
	if *want != "" {
		f := strings.Fields(*want) // "slurm-wlm 24.11.5", or just "24.11.5"
		w := ""
		if len(f) > 0 {
			w = f[len(f)-1]
		}
		p := strings.SplitN(w, ".", 3)
		g := strings.SplitN(got, ".", 3)
		if len(p) < 2 || p[0] != g[0] || p[1] != g[1] {
			fmt.Fprintf(os.Stderr, "pluginrelease: %s is built for Slurm %s, but this Slurm is %q: rebuild it against this Slurm's headers (libslurm-dev)\n", flag.Arg(0), got, *want)
			os.Exit(1)
		}
	}
}
