"""Write the verl parquet for rockroll_grpo.yaml: FrozenLake maps 0-63 to train, 64-79 held out."""

from rockroll.integrations.verl import write_dataset

if __name__ == "__main__":
    paths = write_dataset("data/rockroll-frozenlake", "rock/FrozenLake-v0", list(range(80)), held_out=16)
    print({split: str(p) for split, p in paths.items()})
