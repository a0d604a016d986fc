// Package cli is what Fleet's commands (fleet-host, fleet-worker, fleetctl, fleet-mcp)
// share on top of cobra: flags that an environment variable may also set,
// required flags checked after those variables are read, usage errors
// (exit 2), and the configuration reference generated from the commands
// themselves (docs/configuration.md).
package cli

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envAnnotation marks a flag that an environment variable may set.
const envAnnotation = "fleet_env"

// EnvName is the variable that stands for a flag: FLEET_ and the flag's
// name in upper case, dashes as underscores (--max-requests:
// FLEET_MAX_REQUESTS).
func EnvName(flag string) string {
	return "FLEET_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Env marks the named flags of fs as settable by their variables (EnvName)
// and says so in their help. Only flags whose meaning is the same for
// every command that has them are marked: fleetctl's --state filters jobs
// by state, where fleet-host's names the state directory, so it is not.
func Env(fs *pflag.FlagSet, names ...string) {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic(fmt.Sprintf("cli.Env: no flag --%s", name)) // a programming error, caught by any test of the command
		}
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[envAnnotation] = []string{EnvName(name)}
		f.Usage += fmt.Sprintf(" (or %s)", EnvName(name))
	}
}

// CAFile adds --ca-file, the same in every command that calls a host.
func CAFile(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, "ca-file", "", "a PEM file of CA certificates to trust for an https:// host, besides the system's (a TLS proxy whose certificate a private CA signed)")
}

// envOnlyAnnotation lists a command's variables that no flag stands for,
// as name, default and meaning, for the reference.
const envOnlyAnnotation = "fleet_env_only"

// EnvOnly records a variable cmd reads that no flag stands for (a secret
// that should not sit in a process list, say), for the reference.
func EnvOnly(cmd *cobra.Command, name, def, meaning string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[envOnlyAnnotation] += name + "\x1f" + def + "\x1f" + meaning + "\x1e"
}

// EnvTracing records the OpenTelemetry variables a command reads
// (internal/tracing), for the reference.
func EnvTracing(cmd *cobra.Command, service string) {
	EnvOnly(cmd, "OTEL_EXPORTER_OTLP_ENDPOINT", "", "turns tracing on: spans go over OTLP/HTTP to this collector (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); the other OTEL_EXPORTER_OTLP_* variables (headers, timeout, protocol) apply as the OpenTelemetry SDK reads them")
	EnvOnly(cmd, "OTEL_SERVICE_NAME", service, "the service name on the spans")
	EnvOnly(cmd, "OTEL_TRACES_EXPORTER", "", "otlp turns tracing on without an endpoint variable (the SDK's default endpoint); none turns it off")
	EnvOnly(cmd, "OTEL_SDK_DISABLED", "", "true turns tracing off whatever else is set")
}

// ApplyEnv sets every marked flag of cmd (its own and those it inherits)
// that the command line left alone from its variable, if that is set. A
// value the flag cannot take is a usage error naming the variable.
func ApplyEnv(cmd *cobra.Command) error {
	var err error
	visit := func(f *pflag.Flag) {
		vars := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(vars) == 0 {
			return
		}
		if v, ok := os.LookupEnv(vars[0]); ok {
			if serr := f.Value.Set(v); serr != nil {
				err = UsageError{fmt.Errorf("%s=%q: %v", vars[0], v, serr)}
				return
			}
			f.Changed = true
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return err
}

// Require refuses, as a usage error, a run of cmd without the named
// flags, checked after ApplyEnv so a variable counts.
func Require(cmd *cobra.Command, names ...string) error {
	var missing []string
	for _, name := range names {
		f := cmd.Flags().Lookup(name)
		if f == nil || f.Value.String() == "" {
			m := "--" + name
			if f != nil && len(f.Annotations[envAnnotation]) > 0 {
				m += " (or " + f.Annotations[envAnnotation][0] + ")"
			}
			missing = append(missing, m)
		}
	}
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return Usagef("%s%s is required", subcommand(cmd), missing[0])
	}
	return Usagef("%s%s are required", subcommand(cmd), strings.Join(missing, ", "))
}

// subcommand names cmd for a message the binary's name already begins
// ("serve: "), or nothing for the root.
func subcommand(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return ""
	}
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ") + ": "
}

// UsageError is a mistake in how a command was called: exit 2.
type UsageError struct{ error }

func (e UsageError) Unwrap() error { return e.error }

// Usage marks err as a usage error.
func Usage(err error) error { return UsageError{err} }

// Usagef is a usage error with a formatted message.
func Usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// Args checks a command's positional arguments, as a usage error.
func Args(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return Usagef("%stakes %s", subcommand(cmd), what)
		}
		return nil
	}
}

// Setup gives a command tree the shared behaviour: variables applied
// before each run, flag mistakes as usage errors, and errors printed by
// the caller (Exit), not by cobra.
func Setup(root *cobra.Command) {
	root.SilenceUsage, root.SilenceErrors = true, true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{err} })
	prior := root.PersistentPreRunE
	root.PersistentPreRunE = func(cmd *cobra.Command, a []string) error {
		if err := ApplyEnv(cmd); err != nil {
			return err
		}
		if prior != nil {
			return prior(cmd, a)
		}
		return nil
	}
	root.AddCommand(referenceCommand(root))
}

// IsUsage reports whether err is a usage error (exit 2), including
// cobra's own for an unknown command.
func IsUsage(err error) bool {
	var u UsageError
	return errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command ") || strings.HasPrefix(err.Error(), "unknown flag")
}

// referenceCommand prints the tree's configuration reference as Markdown
// (hidden: docs/configuration.md is made from it).
func referenceCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "config-reference",
		Short:  "Print every command's flags and variables as Markdown",
		Hidden: true,
		Args:   Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), Reference(root))
			return err
		},
	}
}

// Reference is the Markdown reference of every runnable command in the
// tree: what it does, and each flag with its default and variable.
func Reference(root *cobra.Command) string {
	var b strings.Builder
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		if c.Runnable() {
			fmt.Fprintf(&b, "### `%s`\n\n%s.\n\n", c.CommandPath(), strings.TrimSuffix(c.Short, "."))
			writeFlagTable(&b, c)
			writeEnvOnlyTable(&b, c)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return b.String()
}

// writeFlagTable writes a command's flags, its own and inherited, sorted.
func writeFlagTable(b *strings.Builder, c *cobra.Command) {
	var rows []string
	add := func(f *pflag.Flag) {
		if !f.Hidden && f.Name != "help" {
			rows = append(rows, flagRow(f))
		}
	}
	c.NonInheritedFlags().VisitAll(add)
	c.InheritedFlags().VisitAll(add)
	if len(rows) == 0 {
		return
	}
	slices.Sort(rows)
	b.WriteString("| flag | default | variable | meaning |\n| --- | --- | --- | --- |\n")
	b.WriteString(strings.Join(rows, "\n"))
	b.WriteString("\n\n")
}

// flagRow is one flag's row: a default that says nothing (empty, or a
// false bool) is a dash, and the usage drops the "(or VAR)" the variable
// column already gives.
func flagRow(f *pflag.Flag) string {
	def := f.DefValue
	if def == "" || (f.Value.Type() == "bool" && def == "false") {
		def = "–"
	} else {
		def = "`" + def + "`"
	}
	env := "–"
	if v := f.Annotations[envAnnotation]; len(v) > 0 {
		env = "`" + v[0] + "`"
	}
	usage := strings.TrimSuffix(f.Usage, fmt.Sprintf(" (or %s)", strings.Trim(env, "`")))
	return fmt.Sprintf("| `--%s` | %s | %s | %s |", f.Name, def, env, strings.ReplaceAll(usage, "|", `\|`))
}

// writeEnvOnlyTable writes the variables a command reads with no flag.
func writeEnvOnlyTable(b *strings.Builder, c *cobra.Command) {
	only := c.Annotations[envOnlyAnnotation]
	if only == "" {
		return
	}
	b.WriteString("Read from the environment only:\n\n| variable | default | meaning |\n| --- | --- | --- |\n")
	for _, v := range strings.Split(strings.TrimSuffix(only, "\x1e"), "\x1e") {
		f := strings.Split(v, "\x1f")
		def := "–"
		if f[1] != "" {
			def = "`" + f[1] + "`"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s |\n", f[0], def, strings.ReplaceAll(f[2], "|", `\|`))
	}
	b.WriteString("\n")
}

// CheckHostURL refuses a --host that is not an http(s) URL with a host,
// naming the likely fix (url.Parse's own message for "127.0.0.1:8080" is
// about a path segment).
func CheckHostURL(s string) error {
	u, err := url.Parse(s)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return nil
	}
	if !strings.Contains(s, "://") {
		return fmt.Errorf("--host %q has no scheme; did you mean http://%s?", s, s)
	}
	return fmt.Errorf("--host %q is not an http:// or https:// URL with a host", s)
}
