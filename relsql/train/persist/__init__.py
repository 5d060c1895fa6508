"""Files: checkpoints and saved models written atomically as plain data, and the trained model's
state (what Model.save writes, Model.load reads and training ranks receive)."""
