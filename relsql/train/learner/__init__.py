"""The trainable model: the Learner (net and head over a target), one loaded from a file, what it
gives back (predictions, metrics, chosen rows), its record of training, defaults and threads."""
