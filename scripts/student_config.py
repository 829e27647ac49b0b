"""Print _config.yml with exercise solutions hidden (sphinx-exercise's hide_solutions)."""
from pathlib import Path

import yaml

config = yaml.safe_load((Path(__file__).resolve().parent.parent / "_config.yml").read_text())
config["sphinx"]["config"]["hide_solutions"] = True
config["title"] = config["title"] + " (student edition)"
print(yaml.safe_dump(config, sort_keys=False))
