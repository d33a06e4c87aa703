// The CLI's first import (cli.ts): from here on the `yaml` module loads only when a configuration
// file must be parsed (see lib/yaml.ts). Its own module, so that it runs before config.ts does.
import { deferYaml } from "../lib/yaml.ts";

deferYaml();
