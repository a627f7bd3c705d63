package warehouse.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system ({@code file:}, checksums included) with a file's permissions set by Java instead of by
 * a {@code chmod} process. Without Hadoop's native library, which the pyspark wheel does not ship, Hadoop starts one
 * for every folder and file a write creates (a partition's folder, its data file, its checksum file): a Delta write of
 * a month of hourly partitions started about two thousand, which cost more than writing the rows. The local Spark the
 * warehouse starts uses it for {@code file:} ({@code spark.hadoop.fs.file.impl}).
 */
public final class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
  public LocalFileSystem() {
    super(new InProcessPermissions());
  }

  /** Hadoop's raw local file system, its {@link #setPermission} in process (a sticky bit still by Hadoop's way). */
  public static final class InProcessPermissions extends RawLocalFileSystem {
    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      if (permission.getStickyBit()) {
        super.setPermission(path, permission);
        return;
      }
      Set<PosixFilePermission> posix = EnumSet.noneOf(PosixFilePermission.class);
      add(posix, permission.getUserAction(),
          PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE);
      add(posix, permission.getGroupAction(),
          PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE);
      add(posix, permission.getOtherAction(),
          PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);
      Files.setPosixFilePermissions(pathToFile(path).toPath(), posix);
    }

    private static void add(
        Set<PosixFilePermission> posix,
        FsAction action,
        PosixFilePermission read,
        PosixFilePermission write,
        PosixFilePermission execute) {
      if (action.implies(FsAction.READ)) {
        posix.add(read);
      }
      if (action.implies(FsAction.WRITE)) {
        posix.add(write);
      }
      if (action.implies(FsAction.EXECUTE)) {
        posix.add(execute);
      }
    }
  }
}
